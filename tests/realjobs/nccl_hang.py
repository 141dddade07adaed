"""A real 2-rank NCCL job (one GPU per rank) in which rank 1 sleeps inside its forward at step 3.

Rank 0 waits in the all_reduce of step 3; NCCL's watchdog times it out after 20 s and,
with ``TORCH_NCCL_DUMP_ON_TIMEOUT=1`` and ``TORCH_FR_BUFFER_SIZE`` set, every rank's
watchdog writes its Flight Recorder dump to ``TORCH_FR_DUMP_TEMP_FILE<rank>`` by itself
(the stuck rank too: its watchdog thread still runs). Used by test_hangs_gpu.py.
"""

import datetime
import os
import time

import torch
import torch.distributed as dist


def forward(x, step, rank):
    if rank == 1 and step == 3:
        time.sleep(3600)  # a call inside the step that never returns
    return x * 2


def main():
    dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=20))
    rank = dist.get_rank()
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    x = torch.ones(1024, device="cuda")
    for step in range(1, 6):
        y = forward(x, step, rank)
        dist.all_reduce(y)
        torch.cuda.synchronize()
        print(f"rank {rank} step {step}", flush=True)


if __name__ == "__main__":
    main()
