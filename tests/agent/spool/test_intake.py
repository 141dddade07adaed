"""The agent's intake: what reaches the spool from rows and from columns."""

from __future__ import annotations

from firstfault.agent.spool import Spool
from firstfault.agent.spool.columns import ColumnsBuilder
from firstfault.agent.spool.intake import SpoolIntake
from firstfault.common.redact import Redactor

HF = "hf_" + "Ab3dEf6hIj9lMn2pQr5tUv8xYz1Bc4De7F"


def _read(spool: Spool) -> list:
    out: list = []
    while batch := spool.read_after(out[-1].seq if out else None):
        out += batch
    return out


def test_columns_are_redacted_as_rows_are_and_only_the_lines_with_a_secret_change(tmp_path):
    """A chunk's lines as undecoded bytes (the ranklog's hot path) and as str, one file's
    fields shared as a run: the secret is gone from the spool, its own record says what
    was redacted, the other records keep the shared fields untouched."""
    spool = Spool(tmp_path / "spool", node="n1", max_bytes=64 << 20, fsync="never")
    intake = SpoolIntake(spool, Redactor())
    fields = {"path": "/logs/rank0.log"}
    b = ColumnsBuilder()
    b.lines([b"[rank0]: step 1", f"[rank0]: hf_token='{HF}' \u00e9".encode(), b"[rank0]: step 2"],
            10, "job-1", 0, 0, fields)
    b.lines(["[rank0]: caf\u00e9", f"[rank0]: token={HF}"], 11, "job-1", 0, 0, fields)
    intake.columns(b.build())
    recs = _read(spool)
    spool.close()
    assert [HF in r.message for r in recs] == [False] * 5
    assert [r.fields.get("redacted") for r in recs] == [None, "hf-token:1", None, None, "hf-token:1"]
    assert recs[1].message.startswith("[rank0]: hf_token=") and recs[1].message.endswith(" \u00e9")
    assert [r.fields["path"] for r in recs] == [fields["path"]] * 5 and fields == {"path": "/logs/rank0.log"}
    assert intake.redacted == {"hf-token": 2} and intake.records["ranklog"] == 5


def test_chunks_as_read_are_redacted_as_the_lines_joined_again(tmp_path):
    """Lines handed over with their chunk as read (ranklog's ``joined``), between a row of
    their own and other chunks: the same records reach the spool as when the intake joins
    the lines itself."""
    def spooled(joined: bool, path) -> list:
        spool = Spool(path, node="n1", max_bytes=64 << 20, fsync="never")
        intake = SpoolIntake(spool, Redactor())
        b = ColumnsBuilder()
        for k, chunk in enumerate([[b"[rank0]: step 1", f"--token {HF}".encode()],
                                   [b"[rank0]: a\nb"],  # one record with a newline in it
                                   [b"x", f"y hf_token={HF}".encode(), b"z"]]):
            b.lines(chunk, 10 + k, "job-1", 0, 0, {"path": "/l"},
                    joined=b"\n".join(chunk) if joined and k != 1 else None)
        b.row(("ranklog", "rank.line", f"passwd={HF}".encode(), None, 13, None, None, "job-1", 0, 0,
               None, 6, {"path": "/l"}))
        assert bool(b.build().chunks) == joined
        intake.columns(b.build())
        out = [(r.message, r.fields) for r in _read(spool)]
        spool.close()
        return out

    got = spooled(True, tmp_path / "a")
    assert got == spooled(False, tmp_path / "b")
    assert [f.get("redacted") for _, f in got] == [None, "hf-token:1", None, None, "hf-token:1", None,
                                                   "hf-token:1"]
    assert not any(HF in m for m, _ in got)
