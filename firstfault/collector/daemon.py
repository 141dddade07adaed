"""``firstfault collector``: load the configuration, open the store, run the ingest server.

    firstfault collector --listen 0.0.0.0:7140 --db /var/lib/firstfault/firstfault.db \\
        --token-file /etc/firstfault/token

The read-only HTTP API (firstfault/collector/api.py) listens on ``--http`` (loopback by
default) and asks for the same token as ingest (``Authorization: Bearer``) whenever a
token_file is set, on loopback too, unless ``http_open_on_loopback = true``.

Logs go to stderr, one ``key=value`` line per event (journald adds the time under
systemd). SIGTERM or SIGINT stops gracefully: no new connections, batches being
stored are finished and acked, clock estimates saved, the store closed; a second
signal exits at once (nothing acked is lost: acks follow commits). Retention
pruning runs at start and every ``retention.prune_interval_s``.

SIGHUP (``systemctl reload``) reads ``node_tokens_file`` (connections whose token is no
longer their node's are closed) and ``token_file`` again: every line is accepted from
then on by the ingest port and the HTTP API, and agent connections whose token is no
longer among them are closed (firstfault/common/tokens.py says how to rotate a token
without a restart). A file that cannot be read keeps the tokens in use (logged).
Nothing else is reloaded. At start the soft limit on open files is raised (up to the
hard limit) to what max_connections needs.

Under systemd (``Type=notify``, deploy/systemd/firstfault-collector.service) it
says READY=1 once both listeners (ingest and HTTP) are up, with a STATUS line;
pings WATCHDOG=1 from the event loop every WatchdogSec / 2 (a blocked loop stops
the pings and systemd restarts the collector), refreshing STATUS; and says
STOPPING=1 when a signal arrives (firstfault/common/sdnotify.py, shared with the agent).

``--check-config`` checks the configuration (every problem at once), loads the
TLS files and checks that a SQLite file's folder is there to write in, prints the
effective configuration and exits, opening nothing else.

Exit codes: 0 stopped by a signal (or the configuration is ok), 1 could not start
(store, TLS files, address in use), 2 configuration or usage error.
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import signal
import sys
from concurrent.futures import ThreadPoolExecutor

from firstfault.analysis.catalog import load_catalog
from firstfault.collector.api import Api
from firstfault.collector.api import start as start_http
from firstfault.collector.config import USAGE, CollectorConfig, ConfigError, HelpRequested, describe, parse_args
from firstfault.collector.notify.attach import attach as attach_notifier
from firstfault.collector.notify.attach import queue_dir as notify_queue_dir
from firstfault.collector.notify.attach import report_url as notify_report_url
from firstfault.collector.server import IngestServer, make_ssl_context
from firstfault.collector.store import display
from firstfault.collector.store import open_store as open_any_store
from firstfault.collector.store.base import Store, StoreError
from firstfault.common.sdnotify import Notifier
from firstfault.common.tokens import read_node_tokens, read_tokens

log = logging.getLogger("firstfault.collector.daemon")
SWITCH_INTERVAL_S = 0.001  # Python's default is 0.005


class StartError(Exception):
    """The collector cannot start; the message says what to do."""


def open_store(db: str, ingest: bool = False) -> Store:
    """The store for ``db`` (a SQLite file path or a postgres:// URL), marking at
    insert what reports read where the backend keeps marks; ``ingest``: the ingest
    server's writer (store.open_store)."""
    from firstfault.analysis.reads import ReportMarker

    return open_any_store(db, marker=ReportMarker(load_catalog()), ingest=ingest)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        cfg, check = parse_args(argv)
        if check:
            check_config(cfg)
            print(describe(cfg))
            print("configuration ok")
            return 0
    except HelpRequested:
        print(USAGE)
        return 0
    except ConfigError as e:
        print(f"firstfault collector: {e}", file=sys.stderr)
        return 2
    _setup_logging(cfg.log_level)
    # The event loop (ingest, /healthz) shares the GIL with the threads that read and
    # analyse: a shorter switch interval gives it the GIL back sooner while a long query
    # or a paste is analysed (bench/RESULTS.md: the HTTP API fuzz)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    try:
        return asyncio.run(run(cfg))
    except StartError as e:
        log.error("cannot start: %s", e)
        return 1


def check_config(cfg: CollectorConfig) -> None:
    """ConfigError naming what would stop the collector at start, short of opening
    the store or the sockets: the TLS files, a SQLite file's folder."""
    problems = []
    try:
        make_ssl_context(cfg.tls)
    except (OSError, ValueError) as e:
        problems.append(f"tls: cannot load cert/key/client_ca: {e}")
    if "://" not in cfg.db:
        folder = os.path.dirname(os.path.abspath(cfg.db))
        if not os.path.isdir(folder):
            problems.append(f"db {cfg.db}: the folder {folder} does not exist")
        elif not os.access(folder, os.W_OK | os.X_OK):
            problems.append(f"db {cfg.db}: cannot write in {folder}")
    if cfg.notify.enabled:
        q = notify_queue_dir(cfg)
        existing = next((p for p in (q, *q.parents) if p.exists()), None)
        if existing is None or not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
            problems.append(f"notify.queue_dir {q}: cannot write in {existing or q}")
    if problems:
        raise ConfigError(problems)


def _setup_logging(level: str) -> None:
    root = logging.getLogger()
    if not _logs_to_stderr():
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))
        root.addHandler(handler)
    root.setLevel(level.upper())


def _logs_to_stderr() -> bool:
    return any(isinstance(h, logging.StreamHandler) and getattr(h, "stream", None) is sys.stderr
               for h in logging.getLogger().handlers)


async def run(cfg: CollectorConfig, notifier: Notifier | None = None) -> int:
    """Serve until SIGTERM/SIGINT; StartError when something needed is missing."""
    notifier = notifier or Notifier()
    loop = asyncio.get_running_loop()
    log.info("starting %s", describe(cfg))
    writer = ThreadPoolExecutor(1, thread_name_prefix="firstfault-store")
    reader = ThreadPoolExecutor(1, thread_name_prefix="firstfault-query")
    try:
        try:
            # opened on the store thread: every later call runs there too
            store = await loop.run_in_executor(writer, open_store, cfg.db, True)
        except (StoreError, OSError) as e:
            raise StartError(f"cannot open the store db={display(cfg.db)}: {e}") from e
        try:
            # the HTTP API's queries read a second store on their own thread (WAL readers
            # and PostgreSQL sessions do not block the writer): no query holds up ingest
            queries = await loop.run_in_executor(reader, open_store, cfg.db)
        except (StoreError, OSError) as e:
            await loop.run_in_executor(writer, store.close)
            raise StartError(f"cannot open the store db={display(cfg.db)}: {e}") from e
        try:
            return await _serve(cfg, store, writer, notifier, queries, reader)
        finally:
            await loop.run_in_executor(writer, store.close)
            await loop.run_in_executor(reader, queries.close)
    finally:
        writer.shutdown(wait=True)
        reader.shutdown(wait=False, cancel_futures=True)
        notifier.close()


def status_line(server: IngestServer) -> str:
    """The STATUS systemd shows: connections and records so far."""
    m = server.metrics
    return (f"{m.connections_open} agents connected; {m.records_stored} records stored, "
            f"{m.records_duplicate} resends")


async def _watchdog_loop(notifier: Notifier, server: IngestServer) -> None:
    """WATCHDOG=1 from the event loop itself: if the loop hangs, the pings stop."""
    while True:
        await asyncio.sleep(notifier.watchdog_s)
        notifier.send(WATCHDOG=1, STATUS=status_line(server))


async def _serve(cfg: CollectorConfig, store: Store, writer: ThreadPoolExecutor, notifier: Notifier,
                 queries: Store, reader: ThreadPoolExecutor) -> int:
    loop = asyncio.get_running_loop()
    try:
        ssl_context = make_ssl_context(cfg.tls)
    except (OSError, ValueError) as e:  # ssl.SSLError is an OSError
        raise StartError(f"tls: cannot load cert/key/client_ca: {e}") from e
    raise_open_files(cfg.limits.max_connections + 2 * cfg.limits.max_unauthenticated + 64)
    server = IngestServer(store, token=cfg.tokens, limits=cfg.limits, clock=cfg.clock,
                          ssl_context=ssl_context, writer=writer, node_tokens=cfg.node_tokens,
                          bind_node=cfg.tls.bind_node)
    try:
        await server.start(cfg.listen.host, cfg.listen.port)
    except OSError as e:
        raise StartError(f"cannot listen on {cfg.listen}: {e.strerror or e}") from e
    try:
        telling = attach_notifier(cfg, server, load_catalog())
        await telling.start()
    except OSError as e:
        await server.stop()
        raise StartError(f"notify: cannot use the queue folder {notify_queue_dir(cfg)}: {e.strerror or e}") from e
    api = Api(queries, load_catalog(), token=cfg.api_tokens,
              metrics=lambda: server.metrics.render_prometheus() + telling.metrics.render_prometheus(),
              call=lambda fn, *args: loop.run_in_executor(reader, fn, *args),
              redactor=cfg.redact.redactor(), ingest=store, ingest_call=server.call)
    try:
        http = await start_http(api, cfg.http.host, cfg.http.port)
    except (OSError, ValueError) as e:
        await telling.stop()
        await server.stop()
        raise StartError(f"cannot serve the HTTP API on {cfg.http}: {getattr(e, 'strerror', None) or e}") from e
    for host, port, *_ in http.addresses:
        log.info("http listening address=%s:%s auth=%s", host, port, api.tokens is not None)
    telling.report_url = notify_report_url(cfg, http.addresses[0][:2] if http.addresses else None)
    stop = asyncio.Event()
    signals = []

    def on_signal(signum: int) -> None:
        if stop.is_set():
            log.warning("second signal=%s: exiting now", signal.Signals(signum).name)
            os._exit(1)
        log.info("stopping signal=%s", signal.Signals(signum).name)
        notifier.stopping()
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
        signals.append(signum)
    loop.add_signal_handler(signal.SIGHUP, reload_tokens, cfg, server, api)
    signals.append(signal.SIGHUP)
    pruner = asyncio.create_task(_prune_loop(cfg, store, server), name="firstfault-prune")
    tasks = [pruner]
    if notifier.watchdog_s:
        tasks.append(asyncio.create_task(_watchdog_loop(notifier, server), name="firstfault-watchdog"))
    notifier.ready(f"serving ingest on {cfg.listen}, http on {cfg.http}; " + status_line(server))
    try:
        await stop.wait()
    finally:
        for task in tasks:
            task.cancel()
        await http.cleanup()
        await server.stop()
        await telling.stop()
        for signum in signals:
            loop.remove_signal_handler(signum)
    return 0


def reload_tokens(cfg: CollectorConfig, server: IngestServer, api: Api) -> None:
    """SIGHUP: read token_file again (see the module docstring)."""
    problems: list[str] = []
    if cfg.node_tokens_file is not None:
        node_tokens = read_node_tokens(cfg.node_tokens_file, problems)
        if node_tokens is None:
            log.error("reload failed, the node tokens in use are kept: %s", "; ".join(problems))
        else:
            server.node_tokens = node_tokens
            closed = server.recheck()
            log.info("reloaded node_tokens_file=%s nodes=%d connections_closed=%d",
                     cfg.node_tokens_file, len(node_tokens), closed)
    if cfg.token_file is None:
        log.info("reload: no token_file, nothing more to reload")
        return
    problems = []
    tokens = read_tokens(cfg.token_file, problems)
    if tokens is None:
        log.error("reload failed, the tokens in use are kept: %s", "; ".join(problems))
        return
    closed = server.set_tokens(tokens)
    if api.tokens is not None:
        api.tokens = tokens
    log.info("reloaded token_file=%s tokens=%d connections_closed=%d", cfg.token_file,
             len(tokens), closed)


def raise_open_files(wanted: int) -> None:
    """Raise the soft RLIMIT_NOFILE to ``wanted`` (at most the hard limit): systemd and
    shells start services at 1024, too few for 1024 agents and the rest."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    if target < wanted:
        log.warning("open files limited to %d (hard limit), below the %d that limits.max_connections "
                    "needs: raise LimitNOFILE", target, wanted)


async def _prune_loop(cfg: CollectorConfig, store: Store, server: IngestServer) -> None:
    r = cfg.retention
    if not r.max_age_days and not r.max_bytes:
        log.info("retention off (max_age_days=0 max_bytes=0)")
        return
    while True:
        try:
            n = await server.call(lambda: store.prune(
                max_age_s=r.max_age_days * 86400 if r.max_age_days else None,
                max_bytes=r.max_bytes or None))
            if n:
                log.info("pruned records=%d max_age_days=%s max_bytes=%s", n,
                         r.max_age_days, r.max_bytes)
        except Exception as e:  # keep serving; say why data was not pruned
            log.error("prune failed error=%s: %s", type(e).__name__, e)
        await asyncio.sleep(r.prune_interval_s)


if __name__ == "__main__":
    sys.exit(main())
