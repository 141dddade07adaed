"""firstfault: find the first failure of a distributed training job across all ranks and nodes.

The one import package. What runs where (ARCHITECTURE.md has the rules, tests/test_layering.py
enforces them):

- ``firstfault.wire``: the wire format both daemons speak (its docstring is the spec);
- ``firstfault.common``: what both daemons use (settings rules, Prometheus exposition, sd_notify,
  the launchers' log layouts);
- ``firstfault.analysis``: the pure analysis (parse, catalog, verdict, checkpoint, report model);
- ``firstfault.reports``: renderers of a report;
- ``firstfault.offline``: reading log files and folders for ``firstfault analyze``;
- ``firstfault.agent``: the node daemon; ``firstfault.collector``: the central daemon;
- ``firstfault.cli``: the one entry point, the only module that knows every command.
"""

__version__ = "0.2.0"
