"""Fuzzing the ingest port of a real ``firstfault collector`` while a real agent ships to it.

Used by tests/faults/test_ingest_fuzz.py (a small run, in CI) and bench/fuzz_ingest.py (the
long run of bench/RESULTS.md). ``run(work, frames=N, ...)``:

- the collector (SQLite, read timeout ``read_timeout_s``) and an agent following one rank
  log that a writer appends to at ``rate`` lines/s; the agent is SIGKILLed and restarted
  2 s in, so it must get in again through the flood;
- ``idle`` connections opened at the start: half send nothing, half a hello and then
  nothing (reading nothing either); ``slowloris`` connections at a time sending a hello
  one byte every 2 s (one closed is replaced);
- fuzzer processes (``workers``, spawned): each builds a pool of 3,000 frames once (valid
  frames built with firstfault.wire, then mutated: bytes flipped, cut, spliced,
  duplicated, length prefixes that lie; values swapped for other types, huge ints, long
  strings, deep nesting) and decodes them as the collector would, to split those a session
  survives from those that end it; sending one is then only a choice. A connection says
  hello (one in ten sends a mutated hello or garbage instead), sends surviving frames in
  fives, ends with a fatal frame, a msgpack bomb (``bombs()``) or EOF, and reads what the
  collector says until it closes the connection;
- after the fuzzers are done, the writer, the idle and slow connections go on until twice
  the read timeout has passed, so the collector's timeouts have closed them;
- figures (a dict): frames and connections sent, what the fuzzers got back, the
  collector's connections, batches, errors by code, peak RSS (VmHWM), tracebacks in its
  log, whether it is alive and answers /metrics and /api/jobs, idle and slowloris
  connections it closed, and whether every line the writer wrote was stored exactly once.
"""

from __future__ import annotations

import concurrent.futures
import json
import multiprocessing
import random
import re
import signal
import socket
import struct
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

import msgpack

from firstfault import wire
from firstfault.wire import Ack, Batch, Error, Hello, Ping, Pong, Record, encode_message
from firstfault.wiredecode import FrameDecoder

NODE = "fuzz-good"


def _records(rng: random.Random, n: int, stream: str, seq: int) -> list[Record]:
    return [Record(node="fuzz", stream=stream, seq=seq + i, source=rng.choice(["ranklog", "kmsg", "x"]),
                   kind=rng.choice(["rank.line", "kernel.line", "y.z"]),
                   message=rng.choice(["", "[rank0]: step 1", "é" * rng.randint(0, 50), "\x00\x1b[2J"]),
                   occurred_ns=rng.choice([None, 1796206319782000000]), observed_ns=1796206319790000000,
                   job=rng.choice([None, "fuzzjob"]), rank=rng.choice([None, 0, 7]),
                   fields=rng.choice([{}, {"a": 1, "b": "c", "d": 1.5, "e": None, "f": True}]))
            for i in range(n)]


def _frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def _mutate_value(rng: random.Random, v):
    return rng.choice([None, True, -1, 2**63, -(2**63) - 1, 1.5, "", "x" * rng.choice([1, 300, 70000]),
                       b"bin", [], {}, [[[[]]]], {"k": {"k": {}}}, list(range(20)), "\u202e", v])


def _semantic(rng: random.Random, frame: bytes) -> bytes:
    """Decode, change one value somewhere (type, size), re-encode."""
    doc = msgpack.unpackb(frame[4:], raw=False, strict_map_key=False)
    target = doc
    path = []
    while isinstance(target, (dict, list)) and target and rng.random() < 0.7:
        key = rng.choice(list(target)) if isinstance(target, dict) else rng.randrange(len(target))
        path.append((target, key))
        target = target[key]
    if path:
        parent, key = path[-1]
        parent[key] = _mutate_value(rng, target)
    elif isinstance(doc, dict):
        doc[rng.choice(["type", "extra", "count", "seq"])] = _mutate_value(rng, None)
    try:
        return _frame(msgpack.packb(doc, use_bin_type=True))
    except (TypeError, ValueError, OverflowError):
        return frame


def _bytes(rng: random.Random, frame: bytes) -> bytes:
    f = bytearray(frame)
    for _ in range(rng.randint(1, 4)):
        if not f:
            break
        i = rng.randrange(len(f))
        op = rng.randrange(5)
        if op == 0:
            f[i] = rng.randrange(256)
        elif op == 1:
            del f[i:i + rng.randint(1, 16)]
        elif op == 2:
            f[i:i] = rng.randbytes(rng.randint(1, 16))
        elif op == 3:
            f[:4] = struct.pack(">I", rng.choice([0, 1, len(f), 1 << 16, 8 << 20, (8 << 20) + 1, 2**32 - 1]))
        else:
            f += f[:rng.randint(1, len(f))]
    return bytes(f)


def bombs() -> list[bytes]:
    """Frames meant to make a decoder build or wait for far more than they are."""
    head = msgpack.packb({"type": "batch", "node": "fuzz", "stream": "s", "count": 1, "seq": 1})
    maps = b"\xdc" + (10000).to_bytes(2, "big") + (b"\xdc" + (800).to_bytes(2, "big") + b"\x80" * 800) * 10000
    nested = b"\x91" * 100_000 + b"\xc0"  # 100,000 arrays deep
    return [
        _frame(b"\x86" + head[1:] + msgpack.packb("cols") + b"\x81" + msgpack.packb("message") + maps),
        _frame(b"\x86" + head[1:] + msgpack.packb("cols") + b"\x81" + msgpack.packb("message") + nested),
        _frame(b"\x81" + msgpack.packb("type") + b"\xdb" + (2**32 - 1).to_bytes(4, "big")),  # str32 of 4 GiB
        _frame(b"\xdd" + (2**32 - 1).to_bytes(4, "big")),  # array32 of 4 billion
        _frame(b"\xdf" + (2**32 - 1).to_bytes(4, "big")),  # map32 of 4 billion
        struct.pack(">I", 8 << 20) + b"\x80",  # promises 8 MiB, sends 1 byte
        _frame(b"\x86" + head[1:] + msgpack.packb("cols") + b"\x81" + msgpack.packb("message")
               + b"\xdc" + (10000).to_bytes(2, "big") + b"\xa2ab" * 10000),
    ]


def corpus(rng: random.Random) -> list[bytes]:
    """Valid frames of a session of node "fuzz" stream "s": batches, pings, pongs, and
    the messages the collector does not take from an agent (ack, error)."""
    frames = [encode_message(Ping(1)), encode_message(Pong(1, 2, 3)), encode_message(Ack(5)),
              encode_message(Error("x", "y")), _hello("s")]
    for n in (1, 2, 3, 5, 20):
        frames.append(encode_message(Batch(tuple(_records(rng, n, "s", rng.randrange(1, 10**6))))))
    return frames


def frame_pool(rng: random.Random, size: int) -> tuple[list[bytes], list[bytes]]:
    """``size`` mutated frames, split by what the collector's decoder makes of them
    (decoded here once, so that sending one costs nothing): those a session survives
    (a batch of its own node and stream, a ping, a pong) and those that end it."""
    base = corpus(rng)
    survive, fatal = [], []
    for _ in range(size):
        f = _semantic(rng, rng.choice(base)) if rng.random() < 0.6 else _bytes(rng, rng.choice(base))
        try:
            msgs = list(FrameDecoder(batch_columns=True).feed(f))
        except wire.WireError:
            msgs = []
        ok = (len(msgs) == 1 and isinstance(msgs[0], (Ping, Pong, wire.BatchColumns))
              and getattr(msgs[0], "node", "fuzz") == "fuzz" and getattr(msgs[0], "stream", "s") == "s"
              and len(f) == 4 + int.from_bytes(f[:4], "big"))
        (survive if ok else fatal).append(f)
    return survive, fatal


def _hello(stream: str) -> bytes:
    return encode_message(Hello(node="fuzz", stream=stream, token="", agent_ns=1, agent_name="fuzz",
                                agent_version="0"))


def _drain(sock: socket.socket, dec: FrameDecoder, c: Counter) -> bool:
    """Read what the collector sent without waiting; False once it closed."""
    sock.settimeout(0)
    try:
        while data := sock.recv(65536):
            for m in dec.feed(data):
                c["got_" + (m.code if isinstance(m, Error) else type(m).__name__)] += 1
        return False
    except BlockingIOError:
        return True
    finally:
        sock.settimeout(15)


def fuzz_worker(address: tuple[str, int], frames: int, seed: int) -> dict:
    """One process: connections until ``frames`` frames were sent; what happened.

    Each connection says hello (or, one in ten, sends a mutated hello or garbage
    instead), then mutated frames its session survives, and ends with a frame that
    ends it (a mutated one, or one in twenty a msgpack bomb) or, one in four, with
    EOF; then it reads what the collector says until it closes the connection."""
    rng = random.Random(seed)
    survive, fatal = frame_pool(rng, 3000)
    bomb_list, hello = bombs(), _hello("s")
    c: Counter = Counter()
    while c["frames"] < frames:
        try:
            sock = socket.create_connection(address, timeout=15)
        except OSError:
            c["connect_failed"] += 1
            time.sleep(0.05)
            continue
        c["connections"] += 1
        dec = FrameDecoder()
        try:
            if rng.random() < 0.1:  # garbage, or a mutated hello, before any hello
                sock.sendall(_bytes(rng, hello) if rng.random() < 0.5 else rng.randbytes(64))
                c["frames"] += 1
                c["bad_hellos"] += 1
            else:
                sock.sendall(hello)
                open_ = True
                for _ in range(rng.randint(0, 40)):
                    sock.sendall(b"".join(rng.choices(survive, k=5)))
                    c["frames"] += 5
                    if not (open_ := _drain(sock, dec, c)):
                        break
                if open_ and rng.random() < 0.75:
                    bomb = rng.random() < 0.05
                    sock.sendall(rng.choice(bomb_list) if bomb else _bytes(rng, rng.choice(fatal)))
                    c["bombs" if bomb else "fatal_frames"] += 1
                    c["frames"] += 1
            sock.shutdown(socket.SHUT_WR)
            while data := sock.recv(65536):  # until the collector closes (15 s at most)
                for m in dec.feed(data):
                    c["got_" + (m.code if isinstance(m, Error) else type(m).__name__)] += 1
        except (OSError, wire.WireError) as e:
            c[type(e).__name__] += 1
        finally:
            sock.close()
    return dict(c)


def _idle(address, n: int, stop: threading.Event, c: Counter) -> None:
    """``n`` connections: half send nothing, half a hello and then nothing (reading
    nothing either); how many the collector closed, and when."""
    socks = []
    hello = _hello("idle")
    for i in range(n):
        try:
            s = socket.create_connection(address, timeout=10)
            if i % 2:
                s.sendall(hello)
            socks.append(s)
        except OSError:
            c["idle_connect_failed"] += 1
    c["idle_opened"] = len(socks)
    t0 = time.monotonic()
    while socks and not stop.wait(0.5):
        kept = []
        for s in socks:
            try:
                s.setblocking(False)
                while s.recv(65536):
                    pass
                c["idle_closed_by_collector"] += 1
                c["idle_last_closed_s"] = round(time.monotonic() - t0, 1)
                s.close()
            except BlockingIOError:
                kept.append(s)
            except OSError:
                c["idle_closed_by_collector"] += 1
                s.close()
        socks = kept
    for s in socks:
        s.close()


def _slowloris(address, n: int, stop: threading.Event, c: Counter) -> None:
    """``n`` connections at a time, each sending a hello one byte every 2 s; a closed
    one is replaced."""
    hello = _hello("slow")
    socks: list[tuple[socket.socket, int]] = []
    while not stop.is_set():
        while len(socks) < n:
            try:
                socks.append((socket.create_connection(address, timeout=5), 0))
                c["slowloris_connections"] += 1
            except OSError:
                break
        kept = []
        for s, i in socks:
            try:
                s.send(hello[i:i + 1])
                kept.append((s, i + 1))
            except OSError:
                c["slowloris_closed_by_collector"] += 1
                s.close()
        socks = kept
        stop.wait(2.0)
    for s, _ in socks:
        s.close()


def vm_hwm_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"VmHWM:\s+(\d+)", f.read())[1])


def _metrics(http: tuple[str, int]) -> dict[str, float]:
    with urllib.request.urlopen(f"http://{http[0]}:{http[1]}/metrics", timeout=30) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def _api_jobs(http: tuple[str, int]) -> list[str]:
    with urllib.request.urlopen(f"http://{http[0]}:{http[1]}/api/jobs", timeout=30) as r:
        return sorted(j["job"] for j in json.load(r)["jobs"])


def run(work: Path, *, frames: int, workers: int = 2, idle: int = 1000, slowloris: int = 50,
        rate: float = 200.0, read_timeout_s: float = 10.0) -> dict:
    from tests.agent.test_daemon import QUIET, AgentProcess, _stored_lines, settle
    from tests.collector.server.ingest_helpers import CollectorProcess

    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / "rank0.log"
    log.touch()
    db = work / "c.db"
    col = CollectorProcess(db, "--limits-read-timeout-s", f"{read_timeout_s:g}",
                           "--clock-ping-interval-s", f"{read_timeout_s / 5:g}")
    args = (*QUIET, "--kmsg-enabled", "false", "--job", "train-7", "--ranklog", str(logs / "rank{rank}.log"))
    agent = AgentProcess(work / "agent", col.ingest, *args, node=NODE)
    stop, c = threading.Event(), Counter()
    written = [0]

    def write() -> None:
        while not stop.is_set():
            with open(log, "a") as f:
                f.write(f"[rank0]: fuzz-good step {written[0]:07d}\n")
            written[0] += 1
            stop.wait(1 / rate)
    threads = [threading.Thread(target=write), threading.Thread(target=_idle, args=(col.ingest, idle, stop, c)),
               threading.Thread(target=_slowloris, args=(col.ingest, slowloris, stop, c))]
    t0 = time.monotonic()
    try:
        for t in threads:
            t.start()
        per = frames // workers
        spawn = multiprocessing.get_context("spawn")  # not forked: no copies of the idle sockets
        with concurrent.futures.ProcessPoolExecutor(workers, mp_context=spawn) as pool:
            futs = [pool.submit(fuzz_worker, col.ingest, per, 1000 + i) for i in range(workers)]
            time.sleep(2)
            agent.stop(signal.SIGKILL)  # the good agent comes back through the flood
            agent = AgentProcess(work / "agent", col.ingest, *args, node=NODE)
            for f in futs:
                c.update(f.result())
        fuzz_s = time.monotonic() - t0
        # idle and slow connections and the good agent go on until the read timeout closed them
        stop.wait(max(0.0, 2 * read_timeout_s + 2 - fuzz_s))
        stop.set()
        for t in threads:
            t.join(30)
        alive = col.proc.poll() is None
        peak_kib = vm_hwm_kib(col.proc.pid)
        m, jobs = _metrics(col.http), _api_jobs(col.http)
        lines = [f"[rank0]: fuzz-good step {i:07d}" for i in range(written[0])]
        settle(lambda: len(_stored_lines(db, NODE).get(str(log), [])) >= len(lines), 60, "good lines")
        got = _stored_lines(db, NODE).get(str(log), [])
        agent_exit = agent.stop()
    finally:
        stop.set()
        if agent.proc.poll() is None:
            agent.stop(signal.SIGKILL)
        col.stop()
    errors = {k.split('code="')[1][:-2]: int(v) for k, v in m.items()
              if k.startswith("firstfault_collector_errors_total{")}
    return {"frames_sent": c["frames"], "connections": c["connections"], "bombs": c["bombs"],
            "fatal_frames": c["fatal_frames"], "bad_hellos": c["bad_hellos"],
            "fuzzer_got": {k[4:]: v for k, v in sorted(c.items()) if k.startswith("got_")},
            "fuzzer_socket_errors": {k: v for k, v in c.items() if k.endswith(("Error", "failed"))},
            "seconds": round(fuzz_s, 1), "collector_alive": alive,
            "api_jobs": jobs,
            "collector_tracebacks": sum("Traceback" in line for line in col.lines),
            "collector_peak_rss_mib": round(peak_kib / 1024, 1),
            "collector_connections": int(m["firstfault_collector_connections_total"]),
            "collector_batches": int(m["firstfault_collector_batches_total"]),
            "collector_records_stored": int(m["firstfault_collector_records_stored_total"]),
            "collector_errors_by_code": errors,
            "idle_opened": c["idle_opened"], "idle_closed_by_collector": c["idle_closed_by_collector"],
            "idle_last_closed_s": c["idle_last_closed_s"],
            "slowloris_connections": c["slowloris_connections"],
            "slowloris_closed_by_collector": c["slowloris_closed_by_collector"],
            "good_lines_written": len(lines), "good_lines_stored": len(got),
            "good_lines_lost": len(set(lines) - set(got)), "good_lines_duplicated": len(got) - len(set(got)),
            "agent_exit": agent_exit}
