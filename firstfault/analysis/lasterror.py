"""An ncclResult wrapper and the NCCL cause printed under it. Pure.

PyTorch 2.x reports a failed NCCL call as one message over several lines (NCCLUtils.cpp
getNcclErrorDetailStr, ProcessGroupNCCL C10D_NCCL_CHECK):

    torch.distributed.DistBackendError: NCCL error in: .../ProcessGroupNCCL.cpp:1970, internal error - ...
    ncclInternalError: Internal check failed.
    Last error:
    NET/OFI Unable to insert remote address into address vector for device 1. RC: 0

The first lines only name the ncclResult code (signatures with the trait ``nccl-result``); the
line after "Last error:" (``ncclGetLastError``) names the cause, and a signature of its own matches
it (a socket connect, an IB or OFI failure, a duplicate GPU, a CUDA failure). When the message
is a Python traceback the catalog sees it whole and the specific signature wins by file order;
when it is not (a paste of the message alone, a watchdog's C++ exception text), each line is a
finding of its own and the wrapper, one line earlier, would be taken for the failure.

``prefer_details`` drops such a wrapper when its cause follows it in the same stream within
``MAX_GAP`` lines, from the same rank (or both without one), and is a root of a specific
signature: the cause stands for the failure, with the wrapper's words in its links.

Invariants: the order of the findings kept is unchanged; a wrapper with no such cause below it,
and every finding that is not a wrapper, is returned as it came.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar

WRAPPER = "nccl-result"  # the catalog trait of a signature that only names an ncclResult code
MAX_GAP = 4  # lines from the wrapper to its cause: the code's detail line, "Last error:", the cause


class _Event(Protocol):
    stream: str
    seq: int
    rank: int | None
    text: str


class _Finding(Protocol):  # verdict.Finding, as much of it as is read here
    ev: _Event
    links: list[str]

    @property
    def role(self) -> str: ...

    def has(self, trait: str) -> bool: ...


F = TypeVar("F", bound=_Finding)


def _specific_cause(f: _Finding) -> bool:
    return f.role == "root" and not f.has(WRAPPER) and not f.has("generic") and not f.has("mention")


def prefer_details(findings: Sequence[F]) -> list[F]:
    """``findings`` without each wrapper whose "Last error:" cause follows it (module doc)."""
    causes: dict[tuple[str, int | None], list[F]] = {}
    for f in findings:
        if _specific_cause(f):
            causes.setdefault((f.ev.stream, f.ev.rank), []).append(f)
    dropped: set[int] = set()
    for w in findings:
        if not w.has(WRAPPER):
            continue
        below = [c for c in causes.get((w.ev.stream, w.ev.rank), ()) if 0 < c.ev.seq - w.ev.seq <= MAX_GAP]
        if below:
            cause = min(below, key=lambda c: c.ev.seq)
            dropped.add(id(w))
            words = w.ev.text.strip().splitlines()[0][:160] if w.ev.text.strip() else ""
            cause.links.append(f"the NCCL error it explains: {words}")
    return [f for f in findings if id(f) not in dropped]
