"""torch.distributed (gloo, CPU) job where global rank HANG_RANK (default 1) stops calling
collectives at step 3 (stuck in a long sleep); the other ranks time out in all_reduce
after the 15 s process-group timeout. Run under torchrun."""
import datetime
import os
import time

import torch
import torch.distributed as dist


def load_next_batch(rank, step):
    if rank == int(os.environ.get("HANG_RANK", "1")) and step == 3:
        print(f"rank {rank} pid {os.getpid()} stuck loading batch {step}", flush=True)
        time.sleep(120)
    return torch.full((4,), float(rank + step))


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=15))
    rank = dist.get_rank()
    for step in range(1, 6):
        grad = load_next_batch(rank, step)
        dist.all_reduce(grad)
        print(f"rank {rank} step {step} grad_sum {grad.sum().item():.1f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
