"""Node sources: one module per kind of raw fact, one small interface (base.py).

``get(name)`` gives a source's class by its name (= module = config table =
Record.source), importing its module on first use; ``names()`` lists them.
"""

from firstfault.agent.sources.base import (
                   REGISTRY,
                   Draft,
                   Emit,
                   PollingSource,
                   Source,
                   SourceError,
                   SourceRunner,
                   UnknownSourceError,
                   get,
                   names,
                   register,
)

__all__ = ["REGISTRY", "Draft", "Emit", "PollingSource", "Source", "SourceError",
           "SourceRunner", "UnknownSourceError", "get", "names", "register"]
