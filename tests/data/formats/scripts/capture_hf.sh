#!/usr/bin/env bash
# Re-captures the HF Trainer samples (stdout and stderr together, as `> log 2>&1` writes them;
# tqdm's carriage returns are kept). PY must have transformers + accelerate and torch 2.13 CPU.
cd "$(dirname "$0")"
PY=${PY:-python}
export HF_HUB_OFFLINE=1
tmp=$(mktemp -d)
$PY hf_trainer.py ok "$tmp" > ../hf-trainer-ok.log 2>&1; echo ok rc=$?
$PY hf_trainer.py raise "$tmp" > ../hf-trainer-compute-loss-exception.log 2>&1; echo raise rc=$?
$PY hf_trainer.py nan "$tmp" > ../hf-trainer-nan-loss-filtered.log 2>&1; echo nan rc=$?
$PY hf_trainer.py nan_nofilter "$tmp" > ../hf-trainer-nan-loss.log 2>&1; echo nan_nofilter rc=$?
OMP_NUM_THREADS=1 $PY -m torch.distributed.run --nproc_per_node=2 --master_port=29533 \
    hf_trainer.py raise_rank1 "$tmp" > ../hf-trainer-torchrun-ddp-rank1-exception.log 2>&1; echo raise_rank1 rc=$?
rm -rf "$tmp"
