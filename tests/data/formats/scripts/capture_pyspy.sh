#!/usr/bin/env bash
# Re-captures the py-spy dump samples (stdout of py-spy). Needs `pip install py-spy` (0.4.3 used), root.
cd "$(dirname "$0")"
PY=${PY:-python}; PYSPY=${PYSPY:-py-spy}
$PY blocked.py > /dev/null & pid=$!
sleep 2
$PYSPY dump --pid $pid > ../py-spy-dump.log; echo rc=$?
$PYSPY dump --locals --pid $pid > ../py-spy-dump-locals.log; echo rc=$?
kill $pid; wait $pid 2>/dev/null
