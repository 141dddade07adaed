"""The notifier's cost on the event loop: ``Notifier.stored`` over one 10,000-record batch
(what the ingest calls after each batch is durable), per record. Run from the repository
root: ``python3 bench/notify_observe.py``."""

import timeit
from firstfault.collector.notify.notifier import Notifier
from firstfault.collector.notify.config import NotifyConfig
async def rep(j): return {}
n = Notifier(NotifyConfig(), report=rep, clock=lambda n: (5, 10))
N=10000
cases = {
 "one job": {"job":["j1"]*N,"kind":["rank.line"]*N,"rank":[i%8 for i in range(N)],"fields":[{}]*N,"observed_ns":list(range(N))},
 "no job (kernel)": {"job":[None]*N,"kind":["kernel.line"]*N,"rank":[None]*N,"fields":[{}]*N,"observed_ns":list(range(N))},
 "two jobs + an exit": {"job":[f"j{i%2}" for i in range(N)],"kind":["rank.line"]*(N-1)+["proc.exit"],"rank":[i%8 for i in range(N)],"fields":[{}]*(N-1)+[{"code":1}],"observed_ns":list(range(N))},
}
for name,c in cases.items():
    best=min(timeit.repeat(lambda: n.stored("a", c), number=20, repeat=7))/20
    print(f"{name}: {best*1e3:.3f} ms per 10k-record batch, {best/N*1e9:.0f} ns/record")
