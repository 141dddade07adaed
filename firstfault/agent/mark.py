"""``firstfault mark``: tell this node's agent that a job starts or ends here.

    firstfault mark start|end --job ID [--step S] [--nodes LIST] [--state-dir DIR]

Writes one mark file into ``<state-dir>/marks/`` (firstfault/agent/sources/marks.py has the
format) and returns: the agent ships it when it runs, now or after it starts.
For schedulers' prolog/epilog scripts (deploy/slurm/) and for users of torchrun
or other launchers who want a job's nodes named in its report even when one of
them never logs. ``--nodes`` takes the node list as the scheduler gives it (a
Slurm hostlist such as ``gpu-[01-04,07]``; the collector expands it).

Exit codes: 0 the mark is written, 1 it could not be written (the reason on
stderr: no such directory and no right to make it, disk full), 2 usage error.
"""

from __future__ import annotations

import argparse
import sys

from firstfault.agent.config import DEFAULT_STATE_DIR
from firstfault.agent.sources.marks import EVENTS, MarkError, write_mark


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="firstfault mark",
                                description="Mark the start or end of a job on this node for the local agent.")
    p.add_argument("event", choices=EVENTS)
    p.add_argument("--job", required=True, metavar="ID", help="the job id (e.g. $SLURM_JOB_ID)")
    p.add_argument("--step", metavar="S", help="the job step, if the mark is for one step")
    p.add_argument("--nodes", metavar="LIST",
                   help="the job's nodes as the scheduler names them, e.g. $SLURM_JOB_NODELIST")
    p.add_argument("--state-dir", default=DEFAULT_STATE_DIR, metavar="DIR",
                   help=f"the agent's state_dir (default {DEFAULT_STATE_DIR})")
    return p


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    try:
        path = write_mark(a.state_dir, a.event, a.job, step=a.step or None, nodes=a.nodes or None)
    except MarkError as e:
        print(f"firstfault mark: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"firstfault mark: cannot write the mark under {a.state_dir}: {e}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
