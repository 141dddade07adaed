#!/usr/bin/env bash
# Re-captures the srun --label samples on a one-node Slurm "cluster" on this host:
#   apt-get install slurm-wlm munge   (Debian 12: Slurm 22.05.8, munge 0.5.15)
#   su -s /bin/sh munge -c /usr/sbin/munged
#   export SLURM_CONF=/path/to/slurm.conf   (scripts/slurm.conf; its /tmp/ffcap/slurm dirs must exist)
#   /usr/sbin/slurmctld -c -f $SLURM_CONF; /usr/sbin/slurmd -f $SLURM_CONF
# srun's stdout+stderr as `> FILE 2>&1` writes them.
cd "$(dirname "$0")"
export OMP_NUM_THREADS=1
srun --label -n 4 --overcommit python srun_ddp.py > ../srun-label-ddp-rank2-exception.log 2>&1; echo rc=$?
srun --label --kill-on-bad-exit=1 -n 4 --overcommit python srun_ddp.py \
    > ../srun-label-kill-on-bad-exit.log 2>&1; echo rc=$?
# one srun task running torchrun (2 workers), elastic agent at LOGLEVEL=INFO; rank 1 fails
LOGLEVEL=INFO FAIL_RANK=1 srun --label -n 1 python -m torch.distributed.run --nproc_per_node=2 \
    --master_port=29588 ddp_fail.py > ../srun-label-torchrun-loglevel-info.log 2>&1; echo rc=$?
