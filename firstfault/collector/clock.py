"""Each node's clock offset and its uncertainty, from ping/pong exchanges, as NTP does.

Pure: no sockets, no clocks of its own; times are ints in ns since the Unix epoch.

An exchange (firstfault/wire.py): the collector sends ``ping`` at t1 (collector clock),
the agent stamps t2 on receipt and t3 on reply (agent clock), the collector stamps
t4 on receipt. ``wire.clock_offset`` gives theta = agent minus collector (floored ns)
and delay = (t4 - t1) - (t3 - t2); the true offset lies within theta +- delay/2,
however asymmetric the two directions were.

Filter (NTP's clock filter, simplified): keep the last ``samples`` exchanges of a
node. At time ``now`` a sample's distance is delay/2 + rho * (now - t1), rho =
drift_ppm * 1e-6: the delay bound, widened by how far the clocks may have wandered
apart during the exchange and since (NTP's dispersion growing at PHI = 15 ppm; 50 ppm
covers ordinary undisciplined crystals).
The estimate is the sample with the smallest distance, which for samples of the same
age is the smallest delay (queueing only ever adds delay, so the quickest exchange is
the least skewed): ``NodeClock(offset_ns = -theta, uncertainty_ns = ceil(distance))``,
so that node time + offset_ns = collector time, to within uncertainty_ns.

A new sample whose interval [theta - delay/2, theta + delay/2] does not meet the
current estimate's interval means the node's clock was stepped (or drifts faster
than drift_ppm): the older samples are dropped and counted in ``steps``.

Example, a node 5 s ahead with 0.3 ms each way and 0.1 ms in the agent:
``add("gpu-07", t1=1_000_000_000, t2=6_000_300_000, t3=6_000_400_000,
t4=1_000_700_000)`` -> theta = 5 s, delay = 0.6 ms -> offset_ns = -5e9,
uncertainty_ns = 300_035 at t4 (0.7 ms at 50 ppm adds 35 ns).

Invariants: samples with t4 < t1, or a delay more negative than drift can make it
(a clock stepped during the exchange), are rejected and counted, never kept; a
delay negative by drift alone counts as 0. Memory is O(nodes * samples).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from firstfault.collector.store.base import NodeClock
from firstfault.wire import clock_offset


@dataclass(frozen=True, slots=True)
class ClockSample:
    """One exchange: theta_ns is agent minus collector (the wire's sign)."""

    t1_ns: int
    theta_ns: int
    delay_ns: int

    def distance(self, now_ns: int, drift_ppm: float) -> float:
        """The bound on |theta - true offset at now_ns| (ns)."""
        return self.delay_ns / 2 + drift_ppm * 1e-6 * max(0, now_ns - self.t1_ns)


class ClockTracker:
    """Per-node NTP-style offset estimates from ping/pong exchanges."""

    def __init__(self, samples: int = 8, drift_ppm: float = 50.0) -> None:
        if samples < 1 or drift_ppm < 0:
            raise ValueError("samples must be >= 1 and drift_ppm >= 0")
        self.samples = samples
        self.drift_ppm = drift_ppm
        self.rejected = 0  # exchanges whose times make no sense
        self.steps = 0  # clock steps seen (history dropped)
        self._nodes: dict[str, deque[ClockSample]] = {}
        self._last_t4: dict[str, int] = {}
        self._updated: set[str] = set()

    def add(self, node: str, t1: int, t2: int, t3: int, t4: int) -> bool:
        """Take one exchange of ``node``; False (and counted) when it is rejected."""
        theta, delay = clock_offset(t1, t2, t3, t4)
        if t4 < t1 or delay < -(self.drift_ppm * 1e-6 * max(0, t3 - t2) + 1):
            self.rejected += 1
            return False
        sample = ClockSample(t1, theta, max(0, delay))
        history = self._nodes.get(node)
        if history is None:
            history = self._nodes[node] = deque(maxlen=self.samples)
        elif history:
            best = self._best(history, t4)
            if abs(theta - best.theta_ns) > sample.delay_ns / 2 + best.distance(t4, self.drift_ppm):
                history.clear()
                self.steps += 1
        history.append(sample)
        self._last_t4[node] = t4
        self._updated.add(node)
        return True

    def _best(self, history: deque[ClockSample], now_ns: int) -> ClockSample:
        return min(history, key=lambda s: s.distance(now_ns, self.drift_ppm))

    def estimate(self, node: str, now_ns: int | None = None) -> NodeClock | None:
        """The node's clock at collector time ``now_ns`` (default: its latest sample)."""
        history = self._nodes.get(node)
        if not history:
            return None
        now = self._last_t4[node] if now_ns is None else now_ns
        best = self._best(history, now)
        return NodeClock(node=node, offset_ns=-best.theta_ns,
                         uncertainty_ns=math.ceil(best.distance(now, self.drift_ppm)),
                         measured_ns=now)

    def nodes(self) -> list[str]:
        return list(self._nodes)

    def take_updated(self) -> list[str]:
        """Nodes with samples added since the last call (what to save again)."""
        nodes, self._updated = sorted(self._updated), set()
        return nodes

    def give_back(self, nodes: list[str]) -> None:
        """Nodes taken but not saved after all: the next take_updated has them again."""
        self._updated.update(nodes)
