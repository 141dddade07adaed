#!/bin/sh
# firstfault job marks from a Slurm Prolog or Epilog: `mark.sh start|end`, called by prolog.sh
# and epilog.sh beside it. Tells this node's firstfault agent that the job starts or ends here
# (`firstfault mark`, firstfault/agent/mark.py), so the job's report lists every node of the job, even
# one whose ranks never log a line.
#
# It never fails the job: Slurm drains a node whose Prolog or Epilog exits non-zero, so this
# script always exits 0 and logs any problem to syslog (tag firstfault-slurm) and stderr.
# slurmd runs it as root (SlurmdUser) with no PATH and with, among others, SLURM_JOB_ID,
# SLURM_JOB_NODELIST, SLURM_JOB_USER, SLURMD_NODENAME and SLURM_SCRIPT_CONTEXT (prolog_slurmd |
# epilog_slurmd) set (slurm src/plugins/prep/script/prep_script_slurmd.c).
# slurmd's Prolog and Epilog run once per job, not per step, so they pass no --step; a
# SLURM_STEP_ID, where another hook sets one, is passed on.
#
# Settings (environment, e.g. in slurm.conf's Prolog wrapper, or edit the defaults here):
#   FIRSTFAULT            the firstfault command (default /opt/firstfault/bin/firstfault)
#   FIRSTFAULT_STATE_DIR  the agent's state_dir (default: firstfault's own, /var/lib/firstfault-agent)
#   FIRSTFAULT_TIMEOUT_S  give up after this many seconds (default 10)

PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH
FIRSTFAULT="${FIRSTFAULT:-/opt/firstfault/bin/firstfault}"
TIMEOUT_S="${FIRSTFAULT_TIMEOUT_S:-10}"
event="${1:-}"

say() {
    echo "firstfault-slurm: $*" >&2
    command -v logger >/dev/null 2>&1 && logger -t firstfault-slurm -- "$*" 2>/dev/null
    return 0
}

case "$event" in
    start|end) ;;
    *) say "usage: mark.sh start|end (got '$event')"; exit 0 ;;
esac
if [ -z "${SLURM_JOB_ID:-}" ]; then
    say "$event: SLURM_JOB_ID is not set; no mark written"
    exit 0
fi
set -- "$event" --job "$SLURM_JOB_ID"
[ -n "${SLURM_STEP_ID:-}" ] && set -- "$@" --step "$SLURM_STEP_ID"
[ -n "${SLURM_JOB_NODELIST:-}" ] && set -- "$@" --nodes "$SLURM_JOB_NODELIST"
[ -n "${FIRSTFAULT_STATE_DIR:-}" ] && set -- "$@" --state-dir "$FIRSTFAULT_STATE_DIR"

out=$(timeout "$TIMEOUT_S" "$FIRSTFAULT" mark "$@" 2>&1 >/dev/null)
rc=$?
if [ "$rc" -ne 0 ]; then
    say "job ${SLURM_JOB_ID} $event: firstfault mark failed (exit $rc): ${out:-no message}"
fi
exit 0
