#!/usr/bin/env bash
# Re-captures the gloo-timeout hang under torchrun (3 workers; rank 1 hangs at step 3), plus a
# py-spy dump of the hung worker taken while the others wait. Needs py-spy (0.4.3 used), root.
cd "$(dirname "$0")"
PYSPY=${PYSPY:-py-spy}
export OMP_NUM_THREADS=1
out=../torchrun-gloo-timeout-hung-rank.log
python -m torch.distributed.run --nproc_per_node=3 --master_port=29599 ddp_hang.py > $out 2>&1 &
launcher=$!
for i in $(seq 60); do grep -q 'stuck loading' $out && break; sleep 1; done
pid=$(sed -n 's/^rank 1 pid \([0-9]*\) stuck.*/\1/p' $out)
sleep 2
$PYSPY dump --pid "$pid" > ../py-spy-dump-hung-rank.log; echo py-spy rc=$?
wait $launcher; echo torchrun rc=$?
