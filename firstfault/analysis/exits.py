"""Each rank's exit from the best witness. Pure.

Witnesses, best first:

1. the agent's own exit record of the rank process (procs ``proc.exit``: the kernel's
   wait status, read from the zombie). Of several processes the agents saw for one rank
   (a torchelastic restart; an old agent that took a helper which inherited ``RANK``
   for a rank) the one that ended last is the rank's: helpers end before their rank,
   an earlier attempt before the next. When that record has no status (the agent did
   not see the zombie) it witnesses nothing, and no earlier process speaks for the rank;
2. the launcher's summary (torchrun's ``exitcode``, DeepSpeed's exit lines) and the
   kernel's OOM kill, as facts.collect gathered them.

When the agent and the launcher agree on the code, the launcher's words stay (``by``:
the kernel OOM killer).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from firstfault.analysis.events import Event


def agent_exits(procs: Iterable[Event], pids: Mapping[int, int]) -> dict[int, tuple[dict, str | None]]:
    """rank -> (exit, node) of the last-ended process of each rank the agents saw end with a status."""
    last: dict[int, Event] = {}
    for ev in procs:
        if ev.fields.get("proc") != "exit":
            continue
        r = ev.rank if ev.rank is not None else pids.get(ev.pid or -1)
        if r is None:
            continue
        if r not in last or (ev.occurred_ns or 0) >= (last[r].occurred_ns or 0):
            last[r] = ev
    return {r: (ev.fields["exit"], ev.node) for r, ev in last.items() if ev.fields.get("exit", {}).get("code") is not None}


def best_exits(launcher: Mapping[int, dict], agent: Mapping[int, tuple[dict, str | None]]) -> dict[int, dict]:
    """The exits of ``launcher`` (facts.collect's) with each rank's agent record first."""
    out = dict(launcher)
    for r, (ex, _) in agent.items():
        said = out.get(r)
        if said is None or said.get("code") != ex.get("code"):
            out[r] = dict(ex)
    return out
