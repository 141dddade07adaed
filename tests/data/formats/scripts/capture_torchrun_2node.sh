#!/usr/bin/env bash
# Re-captures a 2-"node" torchrun job (two torchrun agents on this host, c10d rendezvous on
# 127.0.0.1:29544, 2 gloo CPU workers each). Global rank 2 raises at step 3 (ddp_fail.py).
# Each agent's stdout+stderr goes to its own file; c10d rendezvous decides which agent gets
# ranks 0-1 and which 2-3, so files are named afterwards by what they hold.
cd "$(dirname "$0")"
PY=${PY:-python}
export OMP_NUM_THREADS=1
for n in a b; do
    $PY -m torch.distributed.run --nnodes=2 --nproc_per_node=2 --rdzv-backend=c10d \
        --rdzv-endpoint=127.0.0.1:29544 --rdzv-id=ffjob ddp_fail.py > /tmp/torchrun-node-$n.log 2>&1 &
done
wait
for n in a b; do
    if grep -q '^\[rank2\]: ValueError' /tmp/torchrun-node-$n.log; then
        mv /tmp/torchrun-node-$n.log ../torchrun-2node-failing-node.log
    else
        mv /tmp/torchrun-node-$n.log ../torchrun-2node-peer-node.log
    fi
done
