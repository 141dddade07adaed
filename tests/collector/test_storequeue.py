"""The ingest server's way to the store: acks written the moment a group is durable."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from firstfault.collector.storequeue import StoreQueue
from firstfault.wire import COLUMNS, BatchColumns


def _batch(node: str, seq: int) -> BatchColumns:
    return BatchColumns(node, "s", range(seq, seq + 1), {c: [None] for c in COLUMNS})


class _Store:
    """insert_columns that logs what it stores and can be held, or fail, per node."""

    def __init__(self, log: list) -> None:
        self.log, self.hold, self.fail = log, {}, set()

    def insert_columns(self, node, stream, seqs, cols) -> int:
        self.log.append(("insert", node))
        if node in self.hold:
            self.hold[node].wait(5)
        if node in self.fail:
            raise OSError("disk gone")
        return len(seqs)


def test_the_ack_is_written_before_the_next_group_goes_to_the_store_thread():
    log: list = []
    store = _Store(log)
    store.hold["a"] = threading.Event()

    async def main() -> None:
        q = StoreQueue(store, ThreadPoolExecutor(1))
        first = asyncio.create_task(q.store_batch(_batch("a", 1), lambda r: log.append(("ack", "a"))))
        await asyncio.sleep(0.05)  # a is on the store thread; b waits for it
        second = asyncio.create_task(q.store_batch(_batch("b", 1), lambda r: log.append(("ack", "b"))))
        await asyncio.sleep(0.05)
        store.hold["a"].set()
        assert (await first)[0] == 1
        await second
        q.writer.shutdown()

    asyncio.run(main())
    assert log == [("insert", "a"), ("ack", "a"), ("insert", "b"), ("ack", "b")]


def test_a_failed_store_writes_no_ack():
    log: list = []
    store = _Store(log)
    store.fail.add("a")

    async def main() -> None:
        q = StoreQueue(store, ThreadPoolExecutor(1))
        with pytest.raises(OSError):
            await q.store_batch(_batch("a", 1), lambda r: log.append(("ack", "a")))
        q.writer.shutdown()

    asyncio.run(main())
    assert log == [("insert", "a")]
