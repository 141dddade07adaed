"""``firstfault COMMAND``: ``agent`` runs the node agent (agent/daemon.py), ``mark`` marks a
job's start or end for it (agent/mark.py), ``demo`` runs the whole path on this machine
(firstfault/demo.py); every other command (analyze, checkpoint, collector, jobs, report,
timeline) is the collector's (collector/cli.py). The only module that knows both packages."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["agent"]:
        from agent.daemon import main as agent_main

        return agent_main(argv[1:])
    if argv[:1] == ["demo"]:
        from firstfault.demo import main as demo_main

        return demo_main(argv[1:])
    if argv[:1] == ["mark"]:
        from agent.mark import main as mark_main

        return mark_main(argv[1:])
    from collector.cli import main as collector_main

    return collector_main(argv)


if __name__ == "__main__":
    sys.exit(main())
