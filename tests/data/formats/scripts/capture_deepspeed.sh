#!/usr/bin/env bash
# Re-captures the DeepSpeed CPU samples: the `deepspeed` launcher with 2 local ranks (gloo on CPU),
# stdout+stderr of the launcher as `> FILE 2>&1` writes them. Needs deepspeed 0.19.8 + torch 2.13 CPU.
cd "$(dirname "$0")"
export OMP_NUM_THREADS=1
deepspeed --num_accelerators 2 --master_port 29561 ds_train.py --mode raise --stage 2 \
    > ../deepspeed-zero2-rank1-exception.log 2>&1; echo raise rc=$?
deepspeed --num_accelerators 2 --master_port 29562 ds_train.py --mode lossscale --stage 1 \
    > ../deepspeed-fp16-loss-scale-at-minimum.log 2>&1; echo lossscale rc=$?
deepspeed --num_accelerators 2 --master_port 29563 ds_train.py --mode branch --stage 3 \
    > ../deepspeed-zero3-bf16-ok.log 2>&1; echo branch rc=$?
