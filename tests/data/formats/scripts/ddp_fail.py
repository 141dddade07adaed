"""Plain torch.distributed (gloo, CPU) job; global rank FAIL_RANK raises at step 3.

Run under torchrun; main() is wrapped in torch.distributed.elastic's @record so the
agent's ChildFailedError report carries the failing worker's traceback.
"""
import os
import time

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record


def train_step(step, rank):
    grad = torch.full((4,), float(rank + step))
    if rank == int(os.environ.get("FAIL_RANK", "2")) and step == 3:
        raise ValueError(f"bad batch on rank {rank} at step {step}: label 137 out of range [0, 100)")
    dist.all_reduce(grad)
    return grad


@record
def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    for step in range(1, 6):
        grad = train_step(step, rank)
        print(f"rank {rank} step {step} grad_sum {grad.sum().item():.1f}", flush=True)
        time.sleep(0.2)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
