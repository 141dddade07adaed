"""``firstfault COMMAND``: the one entry point, and the only module that knows every command.

    analyze, checkpoint            read a dead job's files offline (firstfault/offline/commands.py)
    compare                        a failed run against its retry, from files or the collector
                                   (firstfault/offline/compare_command.py; job ids through the collector's commands)
    jobs, report, timeline         ask a collector or read its store (firstfault/collector/commands.py)
    collector                      run the central daemon (firstfault/collector/daemon.py)
    agent                          run the node daemon (firstfault/agent/daemon.py)
    mark                           mark a job's start or end for this node's agent (firstfault/agent/mark.py)
    demo                           collector + agent + a real failing job on this machine (firstfault/demo.py)

The daemons, ``mark`` and ``demo`` parse their own arguments; their modules are imported
only when asked for, so ``firstfault analyze`` loads neither daemon.
"""

from __future__ import annotations

import argparse
import sys

from firstfault import __version__

# command -> (module, help); each module has main(argv) and parses its own arguments
OWN_PARSERS = {
    "collector": ("firstfault.collector.daemon", "run the collector daemon (firstfault collector --help)"),
    "agent": ("firstfault.agent.daemon", "run the node agent (firstfault agent --help)"),
    "mark": ("firstfault.agent.mark", "mark a job's start or end for this node's agent (firstfault mark --help)"),
    "demo": ("firstfault.demo", "collector + agent + a real failing job here, then the report"),
}


def parser() -> argparse.ArgumentParser:
    from firstfault.collector import commands as collector_commands
    from firstfault.collector.query import QueryError
    from firstfault.collector.store.base import StoreError
    from firstfault.offline import commands as offline_commands
    from firstfault.offline import compare_command

    p = argparse.ArgumentParser(prog="firstfault", description="Find the first failure of a distributed training job.")
    p.add_argument("--version", action="version", version=f"firstfault {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True)
    offline_commands.add_parsers(sub)
    compare_command.add_parser(sub, compare_command.JobSource(
        collector_commands.add_source_options, collector_commands.job_report, (QueryError, StoreError)))
    collector_commands.add_parsers(sub)
    for name, (_, text) in OWN_PARSERS.items():  # listed for --help; main() hands them their arguments
        sub.add_parser(name, add_help=False, help=text)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] and argv[0] in OWN_PARSERS:
        import importlib

        return importlib.import_module(OWN_PARSERS[argv[0]][0]).main(argv[1:])
    from firstfault.collector.query import QueryError
    from firstfault.collector.store.base import StoreError
    from firstfault.common.output import OutputError

    a = parser().parse_args(argv)
    try:
        return a.func(a)
    except (QueryError, StoreError, OutputError) as e:
        print(f"firstfault: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # the reader went away (| head): before OSError, whose kind it is
        return 0
    except OSError as e:  # a file a command reads or writes that no check above foresaw: one line, never a traceback
        where = f"{e.filename}: " if e.filename else ""
        print(f"firstfault {a.cmd}: {where}{e.strerror or e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
