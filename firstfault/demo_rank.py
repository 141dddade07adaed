"""One rank of the demo job (firstfault/demo.py): a small training loop that logs like a
DeepSpeed rank (``[time] [LEVEL] [file:line:func] message``, Python logging) to stdout.

Identity comes from the launcher's environment (RANK, LOCAL_RANK, WORLD_SIZE,
TORCHELASTIC_RUN_ID), as torchrun sets it. The victim rank (``--victim``) fails for
real after ``--fail-at-step`` steps:

- ``--mode oom``: it starts "offloading optimizer state to the CPU": it keeps
  allocating and touching 16 MiB blocks until the kernel's OOM killer of its
  memory cgroup SIGKILLs it (no traceback: exit -9, the kernel's line is the only
  witness);
- ``--mode exception``: it raises on a bad batch (a real Python traceback).

Every other rank steps until the launcher stops it with SIGTERM.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

log = logging.getLogger("demo")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m firstfault.demo_rank")
    p.add_argument("--victim", type=int, default=2)
    p.add_argument("--mode", choices=("oom", "exception"), default="oom")
    p.add_argument("--fail-at-step", type=int, default=5)
    p.add_argument("--step-s", type=float, default=0.2)
    a = p.parse_args(argv)
    logging.basicConfig(stream=sys.stdout, level=logging.INFO,
                        format="[%(asctime)s] [%(levelname)s] [%(filename)s:%(lineno)d:%(funcName)s] "
                               "%(message)s")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    log.info("[Rank %d] initialized: world_size=%d local_rank=%s pid=%d", rank, world,
             os.environ.get("LOCAL_RANK"), os.getpid())
    step = 0
    while True:
        step += 1
        time.sleep(a.step_s)
        log.info("[Rank %d] step=%d loss=%.4f", rank, step, 2.5 / step)
        if rank == a.victim and step == a.fail_at_step:
            if a.mode == "oom":
                offload_optimizer_state(rank)
            else:
                load_batch(step)


def offload_optimizer_state(rank: int) -> None:
    """Grow without bound, 16 MiB at a time, touching every page: the memcg OOM killer ends it."""
    log.info("[Rank %d] offloading optimizer state to CPU memory", rank)
    blocks = []
    while True:
        block = bytearray(16 << 20)
        block[::4096] = b"\1" * len(block[::4096])
        blocks.append(block)
        time.sleep(0.02)


def load_batch(step: int) -> None:
    features = 17
    if features != 16:
        raise ValueError(f"batch {step}: expected 16 features per sample, got {features}")


if __name__ == "__main__":
    sys.exit(main())
