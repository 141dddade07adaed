"""``firstfault agent``: the node daemon — sources -> spool -> shipper -> collector.

    firstfault agent --collector head-01:7140 --token-file /etc/firstfault/token \\
        --ranklog '/scratch/{job}/logs/rank{rank}.log'

Start: read the configuration (firstfault/agent/config.py; ``--check-config`` stops after
checking it and building every source), open the spool under
``state_dir/spool`` (one agent per state dir: the spool is locked), start each
wanted source in its SourceRunner thread (a default-on source that is unavailable
here, such as nvml without a GPU, is skipped with an agent.status record saying
why), start the shipper and /metrics, then tell systemd READY=1.

Running: every ``watchdog`` interval (systemd's WatchdogSec / 2, else 10 s)
check that the shipper's and the sources' threads live and send WATCHDOG=1 and a
STATUS line; a dead thread means no ping, so systemd restarts the agent.

SIGHUP (``systemctl reload``): read ``token_file`` again; the next connection to a
collector sends its first line (firstfault/common/tokens.py: rotating a token without a
restart). A file that cannot be read keeps the token in use (logged).

SIGTERM or SIGINT: STOPPING=1, stop the sources (each returns within about a
second), wait up to ``flush_timeout_s`` until the collector acked everything
spooled, close the spool (fsync), exit 0. What is not acked stays in the spool
and is sent after the next start; nothing is sent twice into the store (the
collector keeps (node, stream, seq) once).
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import ssl
import sys
import threading
import time

from firstfault import __version__
from firstfault.agent.config import AgentConfig, ConfigError, HelpRequested, describe, parse_args, source_options
from firstfault.agent.hostpaths import HostPaths
from firstfault.agent.metrics import MetricsServer, render
from firstfault.agent.shipper import Shipper, ShipperStats
from firstfault.agent.sources import base as sources
from firstfault.agent.spool import Spool, SpoolError
from firstfault.agent.spool.intake import SpoolIntake
from firstfault.common.sdnotify import Notifier
from firstfault.common.settings import read_token
from firstfault.wire import KIND_AGENT_STATUS, SOURCE_AGENT

log = logging.getLogger("firstfault.agent")

FLUSH_TIMEOUT_S = 10.0
# Sources make a tuple per line: at the default 700 the young generation is collected
# every few hundred lines, ~12% of the agent's CPU at full speed (bench/agent.py).
GC_YOUNG_THRESHOLD = 50_000


class StartError(Exception):
    """The agent cannot start: the reason is for the operator."""


def build_sources(cfg: AgentConfig, paths: HostPaths | None = None, *, create_dirs: bool = False
                  ) -> tuple[list[sources.Source], list[tuple[str, str]]]:
    """(the wanted sources, [(name, why skipped)] of default-on ones unavailable here).

    The daemon wires what configuration cannot say: every source gets the host
    paths and its own state dir (and the agent's, to a source that asks for
    ``agent_state_dir``); the procs source the job label; a source taking
    ``pids`` (cgroup) or ``ranks`` (stacks, flightrec) follows the procs source's rank
    processes; kmsg's ``tag`` and ranklog's ``pod_owner`` are the pods source's (OOM kills
    and container logs named by pod); ranklog's ``watch`` tells the stacks source (its trigger) and the
    checkpoints source (the save dirs DeepSpeed's lines name) of every line (once a wake per job). ConfigError for
    options a source rejects, or an explicitly wanted source that cannot run."""
    paths = paths or HostPaths()
    built: dict[str, sources.Source] = {}
    skipped, problems = [], []
    # procs first (others follow its ranks), pods next (kmsg asks it), ranklog last (it calls the watch
    # of stacks and checkpoints)
    order = sorted(cfg.sources.values(), key=lambda s: (s.name != "procs", s.name != "pods", s.name == "ranklog"))
    for sc in order:
        if not sc.wanted:
            continue
        cls = sources.get(sc.name)
        why = cls.unavailable(paths)
        if why is not None and not sc.explicit:
            skipped.append((sc.name, why))
            continue
        if why is not None:
            problems.append(f"sources.{sc.name}: enabled but unavailable here: {why}")
            continue
        kw = dict(sc.options)
        accepts = source_options(cls, wired=True)
        if "job_label" in accepts:
            kw["job_label"] = cfg.job
        if "pids" in accepts and "procs" in built:
            kw["pids"] = built["procs"].pids
        if "ranks" in accepts and "procs" in built:  # stacks, flightrec: pid -> rank identity
            kw["ranks"] = built["procs"].ranks
        if "pod_owner" in accepts and "pods" in built:  # ranklog: a pod's logs get the pod's job and rank
            kw["pod_owner"] = built["pods"].by_uid
        if "tag" in accepts and "pods" in built:  # kmsg: an OOM kill in a pod's cgroup names its rank
            kw["tag"] = built["pods"].tag
        watchers = [built[n].watch for n in ("stacks", "checkpoints") if n in built]
        if "watch" in accepts and watchers:  # ranklog tells stacks and checkpoints of every line, once a wake per job
            kw["watch"] = watchers[0] if len(watchers) == 1 else _fan_out(watchers)
        if "agent_state_dir" in accepts:  # the marks source: <state_dir>/marks, shared with `firstfault mark`
            kw["agent_state_dir"] = str(cfg.state_dir)
        state_dir = os.path.join(cfg.state_dir, "sources", sc.name)
        try:
            if create_dirs:
                os.makedirs(state_dir, mode=0o750, exist_ok=True)
            built[sc.name] = cls(paths=paths, state_dir=state_dir, **kw)
        except (TypeError, ValueError) as e:
            problems.append(f"sources.{sc.name}: {e}")
        except OSError as e:
            problems.append(f"sources.{sc.name}: cannot make its state dir {state_dir}: {e}")
    if problems:
        raise ConfigError(problems)
    return list(built.values()), skipped


def _fan_out(watchers: list):
    """One ranklog ``watch`` hook that tells every watcher, in order."""
    def watch(ident: tuple, raw: bytes, observed_ns: int) -> None:
        for w in watchers:
            w(ident, raw, observed_ns)
    return watch


def ssl_context(cfg: AgentConfig) -> ssl.SSLContext | None:
    if not cfg.tls.enabled:
        return None
    ctx = ssl.create_default_context(cafile=str(cfg.tls.ca) if cfg.tls.ca else None)
    if cfg.tls.cert is not None:
        ctx.load_cert_chain(str(cfg.tls.cert), str(cfg.tls.key))
    return ctx


class Agent:
    """One running agent; ``start()``, then ``run()`` until a signal or ``stop()``."""

    def __init__(self, cfg: AgentConfig, *, paths: HostPaths | None = None,
                 notifier: Notifier | None = None, flush_timeout_s: float = FLUSH_TIMEOUT_S) -> None:
        self.cfg, self.paths = cfg, paths or HostPaths()
        self.notifier = notifier or Notifier()
        self.flush_timeout_s = flush_timeout_s
        self.stopping = threading.Event()  # set: the whole agent stops
        self._sources_stop = sources.StopEvent()  # sources wait on it: no idle wakes
        self.spool: Spool | None = None
        self.intake: SpoolIntake | None = None
        self.shipper: Shipper | None = None
        self.runners: list[sources.SourceRunner] = []
        self.metrics: MetricsServer | None = None

    def start(self) -> None:
        cfg = self.cfg
        srcs, skipped = build_sources(cfg, self.paths, create_dirs=True)
        try:
            os.makedirs(cfg.state_dir, mode=0o750, exist_ok=True)
            self.spool = Spool(os.path.join(cfg.state_dir, "spool"), node=cfg.node,
                               max_bytes=cfg.spool.max_bytes, fsync=cfg.spool.fsync,
                               fsync_interval_ms=cfg.spool.fsync_interval_ms)
        except (OSError, SpoolError) as e:
            raise StartError(f"cannot open the spool in {cfg.state_dir}: {e}") from e
        self.intake = SpoolIntake(self.spool, cfg.redact.redactor())
        for name, why in skipped:
            log.info("source unavailable, skipped source=%s reason=%s", name, why)
            self.intake(sources.Draft(source=SOURCE_AGENT, kind=KIND_AGENT_STATUS,
                                    message=f"source {name} unavailable: {why}",
                                    observed_ns=time.time_ns(),
                                    fields={"source": name, "state": "unavailable",
                                            "error": sources.clip(why)}))
        try:
            ctx = ssl_context(cfg)
        except (OSError, ssl.SSLError) as e:
            raise StartError(f"TLS setup failed: {e}") from e
        if cfg.metrics is not None:  # bound before anything runs: a port in use stops a start that shipped nothing
            try:
                self.metrics = MetricsServer(cfg.metrics, self.metrics_text)
            except OSError as e:
                self.stop_now()
                raise StartError(f"cannot serve /metrics on {cfg.metrics}: {e.strerror or e}") from e
        self.shipper = Shipper(self.spool, cfg.collectors, token=cfg.token, ssl_context=ctx,
                               server_name=cfg.tls.server_name, agent_version=__version__,
                               on_ack=self.intake.acked).start()
        for s in srcs:
            since = s.saved_at_ns()
            if since is not None:  # records spooled after its last saved position
                s.catch_up(self.spool.recent_rows(since or None, s.name))
        self.runners = [sources.SourceRunner(s, self.intake, self._sources_stop).start() for s in srcs]
        log.info("agent started node=%s stream=%s sources=%s collectors=%s metrics=%s",
                 cfg.node, self.spool.stream, ",".join(s.name for s in srcs),
                 ",".join(map(str, cfg.collectors)),
                 self.metrics.address if self.metrics else "off")
        gc.freeze()  # start-up's objects are never garbage: collections skip them
        gc.set_threshold(GC_YOUNG_THRESHOLD)
        self.notifier.ready(self.status_line())

    def metrics_text(self) -> str:
        ship = self.shipper.stats if self.shipper is not None else ShipperStats()  # a scrape while starting
        return render(self.intake, self.spool.stats(), ship)

    def status_line(self) -> str:
        st, ship = self.spool.stats(), self.shipper.stats
        where = f"shipping to {ship.connected_to}" if ship.connected_to else "collector away"
        return (f"{where}; {st.unacked_records} unacked, spool {st.bytes >> 20} MiB; "
                f"{sum(self.intake.records.values())} records")

    def healthy(self) -> bool:
        return self.shipper.alive and all(r.thread.is_alive() for r in self.runners)

    def run(self) -> int:
        """Serve until stop() or SIGTERM/SIGINT; then flush and close. Returns the exit code."""
        interval = self.notifier.watchdog_s or 10.0
        while not self.stopping.wait(interval):
            if self.healthy():
                self.notifier.send(WATCHDOG=1, STATUS=self.status_line())
            else:
                log.error("a thread of the agent died; no watchdog ping, systemd restarts us")
        return self.shutdown()

    def stop(self) -> None:
        self.stopping.set()

    def reload(self) -> None:
        """SIGHUP: read the token file again (see the module docstring)."""
        if self.cfg.token_file is None or self.shipper is None:
            log.info("reload: no token_file, nothing to reload")
            return
        problems: list[str] = []
        token = read_token(self.cfg.token_file, problems)
        if token is None:
            log.error("reload failed, the token in use is kept: %s", "; ".join(problems))
            return
        self.shipper.token = token
        log.info("reloaded token_file=%s (used from the next connection)", self.cfg.token_file)

    def shutdown(self) -> int:
        self.notifier.stopping()
        self._sources_stop.set()
        for r in self.runners:
            if not r.join(5):
                log.warning("source did not stop in time source=%s", r.source.name)
        flushed = self.shipper.stop(self.flush_timeout_s)
        st = self.spool.stats()
        self.stop_now()
        log.info("agent stopped flushed=%s unacked=%d", flushed, st.unacked_records)
        return 0

    def stop_now(self) -> None:
        """Close what is open without flushing."""
        if self.metrics is not None:
            self.metrics.close()
            self.metrics = None
        if self.shipper is not None and self.shipper.alive:
            self.shipper.stop(0)
        if self.spool is not None:
            self.spool.close()
        if not any(r.thread.is_alive() for r in self.runners):
            self._sources_stop.close()  # else a source may still wait on it: the exit closes it
        self.notifier.close()


def _setup_logging(level: str) -> None:
    logging.basicConfig(level=getattr(logging, level.upper()), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s"
                        if sys.stderr.isatty() else "%(levelname)s %(name)s %(message)s")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        cfg, check = parse_args(argv)
        if check:
            build_sources(cfg)
            print(describe(cfg))
            print("configuration ok")
            return 0
    except HelpRequested as h:
        print(h)
        return 0
    except ConfigError as e:
        print(f"firstfault agent: {e}", file=sys.stderr)
        return 2
    _setup_logging(cfg.log_level)
    agent = Agent(cfg)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: agent.stop())
    signal.signal(signal.SIGHUP, lambda *_: agent.reload())
    try:
        agent.start()
    except (StartError, ConfigError) as e:
        print(f"firstfault agent: {e}", file=sys.stderr)
        return 1
    return agent.run()
