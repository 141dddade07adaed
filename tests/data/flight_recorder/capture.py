"""Make real PyTorch Flight Recorder dumps of real gloo jobs on the CPU (run as-is).

    python3 tests/data/flight_recorder/capture.py            # rewrites the scenario folders here

Each scenario runs ``torchrun --standalone --nproc_per_node N`` on this file's
``worker`` with ``TORCH_FR_BUFFER_SIZE=64`` (torch 2.13 records gloo collectives in the
Flight Recorder), gloo timeout 4 s. When a collective raises (gloo's timeout) or the rank
gets SIGTERM from torchrun, the rank writes torch's own dumps:
``torch._C._distributed_c10d._dump_fr_trace()`` (pickle) to ``<scenario>/rank_<R>`` and
``_dump_fr_trace_json()`` to ``<scenario>/json/rank_<R>``. That is what NCCL's
dump-on-timeout does on every rank (gloo has no dump-on-timeout of its own).

Scenarios (rank 1 is the culprit in each):

- ``sleep-2``: 2 ranks, 3 all_reduces each; at the 4th, rank 1 sleeps (in ``forward``);
  rank 0 enters all_reduce #4 and times out; torchrun SIGTERMs rank 1.
- ``branch-4``: 4 ranks; at collective #3 rank 1 calls broadcast where ranks 0, 2, 3 call
  all_reduce: every rank times out.
- ``groups-4``: 4 ranks, a second group (``new_group([0, 1])``, desc ``pair``) used once;
  then rank 1 sleeps while the world all_reduce #3 is entered by 0, 2, 3.
"""

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCENARIOS = {"sleep-2": 2, "branch-4": 4, "groups-4": 4}


def worker(scenario, out):
    import datetime
    import pickle  # noqa: F401 (torch's dump is a pickle; written as bytes)
    import signal

    import torch
    import torch.distributed as dist
    from torch._C._distributed_c10d import _dump_fr_trace, _dump_fr_trace_json

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=4))
    rank = dist.get_rank()

    def dump():
        (out / "json").mkdir(parents=True, exist_ok=True)
        (out / f"rank_{rank}").write_bytes(_dump_fr_trace())
        (out / "json" / f"rank_{rank}").write_bytes(_dump_fr_trace_json())

    def on_term(signum, frame):
        dump()
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    t = torch.ones(4)

    def forward():
        time.sleep(60)

    try:
        if scenario == "sleep-2":
            for _ in range(3):
                dist.all_reduce(t)
            if rank == 1:
                forward()
            dist.all_reduce(t)
        elif scenario == "branch-4":
            dist.all_reduce(t)
            dist.all_reduce(t)
            if rank == 1:
                dist.broadcast(t, 0)
            else:
                dist.all_reduce(t)
        elif scenario == "groups-4":
            pair = dist.new_group([0, 1], group_desc="pair")
            dist.all_reduce(t)
            if rank in (0, 1):
                dist.all_reduce(t, group=pair)
            dist.all_reduce(t)
            if rank == 1:
                forward()
            dist.all_reduce(t)
    except RuntimeError:
        dump()
        raise


def main():
    if len(sys.argv) == 3:
        return worker(sys.argv[1], Path(sys.argv[2]))
    torchrun = str(Path(sys.executable).parent / "torchrun")
    for name, n in SCENARIOS.items():
        out = HERE / name
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        env = {"PATH": os.environ["PATH"], "HOME": "/root", "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1",
               "TORCH_FR_BUFFER_SIZE": "64"}
        r = subprocess.run([torchrun, "--standalone", "--nproc_per_node", str(n), __file__, name, str(out)],
                           env=env, capture_output=True, text=True, timeout=300)
        print(f"{name}: torchrun exit {r.returncode}; dumps: {sorted(p.name for p in out.glob('rank_*'))}")


if __name__ == "__main__":
    main()
