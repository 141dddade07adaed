"""torch.distributed (gloo, CPU) job started directly by srun: one task per rank.
Rank/world size come from SLURM_PROCID / SLURM_NTASKS; global rank FAIL_RANK (default 2)
raises at step 3."""
import os
import time

import torch
import torch.distributed as dist


def main():
    rank = int(os.environ["SLURM_PROCID"])
    world = int(os.environ["SLURM_NTASKS"])
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29577", rank=rank, world_size=world)
    print(f"rank {rank}/{world} on {os.uname().nodename} started", flush=True)
    for step in range(1, 6):
        grad = torch.full((4,), float(rank + step))
        if rank == int(os.environ.get("FAIL_RANK", "2")) and step == 3:
            raise ValueError(f"bad batch on rank {rank} at step {step}: label 137 out of range [0, 100)")
        dist.all_reduce(grad)
        print(f"rank {rank} step {step} grad_sum {grad.sum().item():.1f}", flush=True)
        time.sleep(0.2)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
