"""The agent's Prometheus /metrics (text exposition format 0.0.4) on a loopback port.

    firstfault_agent_records_total{source}        records spooled, by source
    firstfault_agent_redacted_total{pattern}      secrets redacted before spooling, by pattern
    firstfault_agent_spool_full_waits_total       times a source held its rows: the disk is full
    firstfault_agent_source_up{source}            1 running, 0 failed/stopped/unavailable
    firstfault_agent_spool_bytes                  bytes in the spool's segments
    firstfault_agent_spool_unacked_records        records the collector has not acked
    firstfault_agent_spool_dropped_records_total  lost to overflow, corruption or a full disk, since
                                                  this agent process started (a counter: it starts
                                                  at 0 again after a restart, as Prometheus' rate()
                                                  and increase() expect; the gap records, shipped
                                                  to the collector, are the lasting account)
    firstfault_agent_spool_gaps_total             gap records written for them
    firstfault_agent_shipped_records_total        records sent (resends included)
    firstfault_agent_shipped_bytes_total
    firstfault_agent_acked_seq                    highest seq the collector acked
    firstfault_agent_connected                    1 while a collector session is up
    firstfault_agent_session_failures_total       failed connections or sessions
    firstfault_agent_send_lag_seconds             age of the oldest unacked record
    firstfault_agent_ack_latency_seconds          append-to-ack time of the last ack

``GET /metrics`` answers these; ``GET /healthz`` "ok". Nothing else, read-only.
"""

from __future__ import annotations

import logging
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

from firstfault.agent.osthread import name_this_thread
from firstfault.agent.shipper import ShipperStats
from firstfault.agent.spool import SpoolStats
from firstfault.agent.spool.intake import SpoolIntake
from firstfault.common.prometheus import CONTENT_TYPE, family
from firstfault.common.settings import Address

log = logging.getLogger(__name__)


def render(intake: SpoolIntake, spool: SpoolStats, ship: ShipperStats) -> str:
    p = "firstfault_agent_"
    out = family(p + "records_total", "counter", "Records spooled, by source.",
                 [("", {"source": s}, n) for s, n in sorted(intake.records.items())])
    out += family(p + "redacted_total", "counter", "Secrets redacted before spooling, by pattern.",
                  [("", {"pattern": k}, n) for k, n in sorted(intake.redacted.items())])
    out += family(p + "source_up", "gauge", "1 while the source runs.",
                  [("", {"source": s}, int(st == "running"))
                   for s, st in sorted(intake.source_states.items())])
    dropped = spool.dropped_records + spool.disk_full_records
    plain = [
        ("spool_bytes", "gauge", "Bytes in the spool.", spool.bytes),
        ("spool_unacked_records", "gauge", "Records not yet acked by a collector.",
         spool.unacked_records),
        ("spool_dropped_records_total", "counter",
         "Records lost to spool overflow, corruption or a full disk, since this process started.",
         dropped),
        ("spool_gaps_total", "counter", "Gap records written.", spool.gaps_written),
        ("spool_full_waits_total", "counter", "Times a source held its rows: the spool's disk "
         "was full (nothing lost).", intake.spool_full_held),
        ("shipped_records_total", "counter", "Records sent, resends included.", ship.records),
        ("shipped_bytes_total", "counter", "Bytes of batch frames sent.", ship.bytes),
        ("acked_seq", "gauge", "Highest seq acked by a collector.", ship.acked_seq or 0),
        ("connected", "gauge", "1 while a collector session is up.",
         int(ship.connected_to is not None)),
        ("session_failures_total", "counter", "Failed connections or sessions.", ship.failures),
        ("send_lag_seconds", "gauge", "Age of the oldest unacked record.", intake.send_lag_s()),
        ("ack_latency_seconds", "gauge", "Append-to-ack time of the last acked record.",
         intake.last_ack_latency_s or 0.0),
    ]
    for name, kind, help_, value in plain:
        out += family(p + name, kind, help_, value)
    return "\n".join(out) + "\n"


class MetricsServer:
    """A tiny read-only HTTP server for /metrics and /healthz, in its own thread."""

    def __init__(self, address: Address, text: Callable[[], str]) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                if self.path == "/metrics":
                    body, ctype = text().encode(), CONTENT_TYPE
                elif self.path == "/healthz":
                    body, ctype = b"ok\n", "text/plain"
                else:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, fmt: str, *args) -> None:
                log.debug("metrics %s", fmt % args)

        family = socket.AF_INET6 if ":" in address.host else socket.AF_INET
        server = type("Server", (ThreadingHTTPServer,), {"address_family": family,
                                                         "daemon_threads": True})
        self.server = server((address.host, address.port), Handler)
        self.address = Address(address.host, self.server.server_address[1])
        self.thread = threading.Thread(target=self._serve, name="ff-metrics",
                                       daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        name_this_thread()
        self.server.serve_forever()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)
