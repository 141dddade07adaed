"""The shipped failure catalog loads, each signature matches its own examples
first, and a broken catalog reports every problem at once."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from firstfault.analysis.catalog import (
    CATEGORIES,
    PHASES,
    ROLES,
    CatalogError,
    load_catalog,
    needle_regex,
    parse_catalog,
    render,
)

CATALOG = load_catalog(check=True)  # every regex compiled and every placeholder checked
EXAMPLES = [(s.id, i, ex) for s in CATALOG.signatures for i, ex in enumerate(s.examples)]
NOT_EXAMPLES = [(s.id, ex) for s in CATALOG.signatures for ex in s.not_examples]


def _short(text: str) -> str:
    return text.strip().splitlines()[-1][:60]


def test_shipped_catalog_loads_with_unique_ids():
    ids = [s.id for s in CATALOG.signatures]
    assert len(ids) == len(set(ids)) >= 60
    assert [s.index for s in CATALOG.signatures] == list(range(len(ids)))
    assert CATALOG.get("nccl.watchdog_timeout").role == "cascade"
    assert CATALOG.get("no.such_signature") is None


def test_a_pattern_belongs_to_one_signature():
    """Two signatures with one pattern: only the first can ever win with it (the rules are
    read in file order), so the second's summary and advice are dead text; unless the first's
    match counts only under a condition (``greater``), when the second takes the rest."""
    owners: dict[str, str] = {}
    for s in CATALOG.signatures:
        for p in s.patterns:
            owner = owners.setdefault(p.pattern, s.id)
            assert owner == s.id or CATALOG.get(owner).greater is not None, f"{s.id} repeats a pattern of {owner}"
            if CATALOG.get(owner).greater is not None:
                owners[p.pattern] = s.id


def test_vocabularies():
    for s in CATALOG.signatures:
        assert s.role in ROLES, s.id
        assert s.category in CATEGORIES, s.id
        assert (s.role == "cascade") == (s.category == "cascade"), s.id
        assert all(p in PHASES for p in s.phases), s.id
        assert s.needles and s.patterns and s.examples, s.id
        assert "\n" not in s.summary and "\n" not in s.first_action, s.id
        assert s.reference.strip(), s.id


def test_required_coverage():
    """The guide's failures and the families the brief names are all there."""
    required = {
        "deepspeed.oom_at_init", "deepspeed.config_validation", "deepspeed.batch_size_mismatch",
        "deepspeed.zero3_param_in_flight", "deepspeed.zero3_inflight_at_backward",
        "torchelastic.worker_sigkill", "deepspeed.fp16_loss_scale_min", "deepspeed.zero3_mixed_dtype_allgather",
        "deepspeed.pipe_shape_mismatch", "deepspeed.oom_from_pretrained", "deepspeed.checkpoint_save_start",
        "nccl.watchdog_timeout", "gloo.peer_closed", "gloo.peer_reset", "gloo.timeout",
        "torchelastic.child_failed", "torchelastic.sending_signal", "deepspeed.launcher_kill",
        "deepspeed.launcher_exit", "cuda.oom", "cuda.illegal_memory_access", "cuda.device_assert",
        "cuda.ecc_uncorrectable", "cuda.launch_failure", "cuda.error", "nccl.system_error",
        "nccl.internal_error", "nccl.remote_error", "nccl.ib_completion_error", "nccl.warn",
        "kernel.oom_kill", "kernel.memcg_oom_kill", "kernel.oom_kill_constraint", "kernel.oom_invoked",
        "kernel.segfault", "kernel.hung_task", "kernel.mce", "kernel.pcie_aer_uncorrectable", "nvidia.xid",
        "nvidia.sxid_fatal", "nvidia.gpu_fell_off_bus", "storage.enospc", "storage.eio",
        "storage.stale_file_handle", "deepspeed.progress", "deepspeed.checkpoint_saving_file",
        "deepspeed.checkpoint_saved", "deepspeed.version_info", "numerics.nan_loss", "torch.anomaly_nan",
        "python.exception",
    }
    assert required <= {s.id for s in CATALOG.signatures}
    # the last resorts come last: an exception line, a cut traceback, then mere words in prose; after them
    # only lines that tell a phase and nothing else (99-phase-markers.toml): set-up, work other than training and
    # its end (before the training bar, whose tqdm format they share), training
    assert [s.id for s in CATALOG.signatures[-5:]] == ["setup.phase_marker", "tqdm.data_work_bar", "tqdm.eval_work_bar",
                                                       "training.fit_ended", "training.bar_progress"]
    # (words naming a phase and a failure before words naming a failure alone: "OOM while saving the model"
    # keeps both, its category from the words)
    assert [s.id for s in CATALOG.signatures[-15:-5]] == ["python.exception", "python.traceback",
                                                       "text.phase_failure_mention", "text.init_failure_mention",
                                                       "text.load_failure_mention", "text.task_failure_mention",
                                                       "text.overflow_mention", "text.killed_mention",
                                                       "text.failure_mention", "text.exception_quoted"]


def test_launcher_roles():
    """A -9 exit is a root candidate; a launcher's SIGTERM is a cascade; summaries are context."""
    assert CATALOG.get("torchelastic.worker_sigkill").role == "root"
    # a SIGKILL alone does not say who sent it: the kernel's OOM kill, when given, is the host-memory finding
    assert CATALOG.get("torchelastic.worker_sigkill").category == "unknown"
    for sid in ("torchelastic.worker_sigterm", "torchelastic.sending_signal", "deepspeed.launcher_kill",
                "torchelastic.agent_signal", "gloo.peer_closed", "nccl.remote_error"):
        assert CATALOG.get(sid).role == "cascade", sid
    for sid in ("torchelastic.child_failed", "deepspeed.launcher_exit", "kernel.oom_kill_constraint",
                "kernel.oom_invoked", "deepspeed.progress"):
        assert CATALOG.get(sid).role == "context", sid


@pytest.mark.parametrize("sig_id,i,text", EXAMPLES, ids=[f"{s}[{i}]" for s, i, _ in EXAMPLES])
def test_example_first_match_is_its_own_signature(sig_id, i, text):
    sig = CATALOG.get(sig_id)
    assert any(p.search(text) for p in sig.patterns), f"{sig_id} does not match its example {_short(text)!r}"
    m = CATALOG.match(text)
    assert m is not None
    assert m.signature.id == sig_id, f"{m.signature.id} shadows {sig_id} on {_short(text)!r}"
    assert CATALOG.prefilter.search(text), "the prefilter must hit every example"
    assert not re.search(r"\{\w+\}", m.summary), f"unrendered placeholder in {m.summary!r}"


@pytest.mark.parametrize("sig_id,text", NOT_EXAMPLES, ids=[s for s, _ in NOT_EXAMPLES])
def test_not_examples_do_not_match(sig_id, text):
    sig = CATALOG.get(sig_id)
    m = CATALOG.match(text)
    assert m is None or m.signature.id != sig_id
    assert not (any(n in text for n in sig.needles)
                and any((m := p.search(text)) and sig.holds(m.groupdict()) for p in sig.patterns))


def test_a_conditional_match_that_does_not_hold_lets_the_next_signature_try():
    """c10d's store barrier: more processes joined than the world is a launch that started too many
    (config); fewer is ranks that never came (a cascade of their failure)."""
    line = ("RuntimeError: Timed out initializing process group in store based barrier on rank: 0, for key: "
            "store_based_barrier_key:1 (world_size=8, worker_count={n}, timeout=0:30:00)")
    assert CATALOG.match(line.format(n=16)).signature.id == "c10d.store_barrier_overjoined"
    assert CATALOG.match(line.format(n=7)).signature.id == "c10d.store_barrier_timeout"
    assert CATALOG.match(line.format(n=8)).signature.id == "c10d.store_barrier_timeout"


def test_every_pattern_has_a_needle_in_all_its_examples_and_is_exercised():
    for s in CATALOG.signatures:
        for j, p in enumerate(s.patterns):
            hits = [ex for ex in s.examples if p.search(ex)]
            assert hits, f"{s.id} pattern {j} matches none of its examples"
            for ex in hits:
                assert any(n in ex for n in s.needles), f"{s.id} pattern {j}: no needle in {_short(ex)!r}"


def test_match_fields():
    m = CATALOG.match(
        "[ 2002.145344] Memory cgroup out of memory: Killed process 24215 (python3) total-vm:12531344kB, "
        "anon-rss:1572864kB, file-rss:81920kB, shmem-rss:0kB, UID:0 pgtables:3460kB oom_score_adj:0")
    assert m.signature.id == "kernel.memcg_oom_kill"
    assert (m.role, m.category) == ("root", "host-memory")
    assert m.groups == {"pid": "24215", "comm": "python3", "anon_rss_kb": "1572864"}
    assert "pid 24215" in m.summary and "python3" in m.summary
    w = CATALOG.match("[rank0]:[E1218 20:27:21.426415540 ProcessGroupNCCL.cpp:629] [Rank 0] Watchdog caught "
                      "collective operation timeout: WorkNCCL(SeqNum=1, OpType=BROADCAST, NumelIn=131072000, "
                      "NumelOut=131072000, Timeout(ms)=600000) ran for 600081 milliseconds before timing out.")
    assert w.groups["timeout_ms"] == "600000" and w.groups["op"] == "BROADCAST" and w.groups["seq"] == "1"
    assert "sequence 1" in w.first_action
    g = CATALOG.match("[rank0]: RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] "
                      "Timed out waiting 60000ms for recv operation to complete")
    assert (g.signature.id, g.role, g.category) == ("gloo.timeout", "cascade", "cascade")
    assert g.groups == {"timeout_ms": "60000", "op": "recv"}
    p = CATALOG.match("[2026-12-02 10:11:59,782] [INFO] [timer.py:264:stop] epoch=0/micro_step=10/global_step=10, "
                      "RunningAvgSamplesPerSec=412.55, CurrSamplesPerSec=431.02, MemAllocated=0.72GB, "
                      "MaxMemAllocated=0.76GB")
    assert p.groups["step"] == "10" and p.role == "context"
    c = CATALOG.match("[Rank 0] Saving model checkpoint: /ckpt/run1/global_step10/mp_rank_00_model_states.pt")
    assert c.groups == {"path": "/ckpt/run1/global_step10/mp_rank_00_model_states.pt", "tag": "global_step10"}
    k = CATALOG.match("E1202 10:12:00.462000 2611 torch/distributed/elastic/multiprocessing/api.py:1002] "
                      "failed (exitcode: -9) local_rank: 1 (pid: 24215) of binary: /usr/bin/python3")
    assert k.groups == {"exitcode": "-9", "local_rank": "1", "pid": "24215"}


def test_a_missing_placeholder_s_parenthesis_is_left_out():
    """What the line did not say is not shown as a blank: the aside that would hold it goes."""
    m = CATALOG.match("[rank3]: RuntimeError: CUDA error: out of memory")
    assert m.signature.id == "cuda.oom"
    assert m.summary == "The GPU ran out of memory."
    m = CATALOG.match("ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.")
    assert "<" not in m.summary and "()" not in m.summary and "  " not in m.summary


def test_render_never_raises():
    assert render("pid {pid} of {comm}", {"pid": "7"}) == "pid 7 of <comm>"
    assert render("unbalanced {pid", {"pid": "7"}) == "unbalanced {pid"
    assert render("{a.b} and {0}", {}) == "<a.b> and <0>"
    assert render("A worker (pid {pid}) died ({why}).", {"pid": "7"}) == "A worker (pid 7) died."
    assert render("as (nested (x {a}) y) said", {}) == "as (nested y) said"
    assert render("a value with \x00 in it: {v}", {"v": "x\x00y"}) == "a value with  in it: xy"


def test_xid_table():
    assert CATALOG.xid(79).category == "hardware" and CATALOG.xid(79).bucket == "hardware"
    assert CATALOG.xid(13).category == "user-code" and CATALOG.xid(13).bucket == "application"
    assert CATALOG.xid(31).category == "user-code"
    assert CATALOG.xid(63).bucket == "informational" and CATALOG.xid(63).role == "context"
    assert CATALOG.xid(119).bucket == "driver" and CATALOG.xid(119).role == "root"
    assert CATALOG.xid(45).role == "context"
    for code in (48, 64, 74, 94, 95, 140):
        assert CATALOG.xid(code).category == "hardware", code
    assert CATALOG.xid(424242) is None


def test_xid_match_takes_the_tables_category():
    m = CATALOG.match("NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.")
    assert (m.signature.id, m.category, m.role) == ("nvidia.xid", "hardware", "root")
    assert m.groups["xid"] == "79" and m.groups["pci"] == "0000:3b:00" and m.groups["pid"] == "1234"
    assert "GPU has fallen off the bus" in m.summary and m.xid.code == 79
    app = CATALOG.match("NVRM: Xid (PCI:0000:3b:00): 13, pid=24215, name=python3, Graphics SM Warp Exception")
    assert app.category == "user-code"
    info = CATALOG.match("NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping")
    assert info.role == "context"
    unknown = CATALOG.match("NVRM: Xid (PCI:0000:01:00): 32, Channel ID 00000009 intr 00800000")
    assert (unknown.category, unknown.role, unknown.xid) == ("unknown", "root", None)
    assert unknown.summary == "GPU 0000:01:00 reported Xid 32."  # no name for a code the table does not know


def test_line_without_needles_matches_nothing():
    line = "[2026-12-02 10:11:59,782] [INFO] [engine.py:100:fn] all good, 12 samples per second"
    assert CATALOG.prefilter.search(line) is None
    assert CATALOG.match(line) is None


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(EXAMPLES), min_size=1, max_size=3), st.text(max_size=40))
def test_no_match_without_a_prefilter_hit(picked, noise):
    # Cut examples apart and glue them to noise: whatever matches, the prefilter hits.
    for _, _, ex in picked:
        for cut in (noise + ex[: len(ex) // 2], ex[len(ex) // 3 :] + noise, noise):
            if CATALOG.match(cut) is not None:
                assert CATALOG.prefilter.search(cut)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(alphabet="ab c", min_size=1, max_size=5), min_size=1, max_size=8),
       st.text(alphabet="ab c", max_size=30))
def test_needle_regex_hits_exactly_where_a_needle_occurs(needles, text):
    assert bool(needle_regex(needles).search(text)) == any(n in text for n in needles)


def test_load_from_a_path(tmp_path):
    p = tmp_path / "sigs.toml"
    p.write_text(
        '[[signature]]\nid = "demo.thing"\nrole = "root"\ncategory = "unknown"\nphases = []\n'
        'needles = ["boom"]\npatterns = [\'boom (?P<n>\\d+)\']\nsummary = "boom {n}"\n'
        'first_action = "look"\nreference = "here"\nexamples = ["boom 3"]\n')
    cat = load_catalog(p)
    m = cat.match("x boom 3")
    assert (m.signature.id, m.summary, m.groups) == ("demo.thing", "boom 3", {"n": "3"})
    assert cat.match("x boom") is None and cat.xid(79) is None


BAD = """
version = 1
colour = "blue"

[[signature]]
id = "Bad Id"
role = "culprit"
category = "cosmic-rays"
phases = ["warmup"]
needles = []
patterns = ['(unclosed']
summary = "saw {nothing}"
first_action = "multi\\nline"
reference = "somewhere"
examples = ["x"]
extra_key = 1

[[signature]]
id = "ok.one"
role = "cascade"
category = "network"
needles = ["a"]
patterns = ['a']
summary = "a"
first_action = "b"
reference = "c"
examples = ["a"]

[[signature]]
id = "ok.one"
role = "root"
category = "unknown"
phases = []
needles = ["a"]
patterns = ['a']
summary = "a"
first_action = "b"
reference = "c"
examples = ["a"]

[[signature]]
id = "ok.two"
role = "root"
category = "config"
phases = []
needles = ["b"]
patterns = ['b (?P<n>\\d+)']
summary = "a"
first_action = "b"
reference = "c"
examples = ["b 1"]
greater = ["n"]

[[signature]]
id = "ok.three"
role = "root"
category = "config"
phases = []
needles = ["b"]
patterns = ['c (?P<n>\\d+)']
summary = "a"
first_action = "b"
reference = "c"
examples = ["c 1"]
greater = ["n", "world"]

[xid.79]
name = "GPU has fallen off the bus"
bucket = "broken"
category = "hardware"

[xid.abc]
name = "x"
bucket = "hardware"
category = "hardware"
"""


def test_bad_catalog_reports_every_problem_at_once(tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text(BAD)
    with pytest.raises(CatalogError) as info:
        load_catalog(p)
    problems = info.value.problems
    expected = [
        r"unknown top-level key 'colour'",
        r"'Bad Id'.*id must be dotted",
        r"'Bad Id'.*role 'culprit'",
        r"'Bad Id'.*category 'cosmic-rays'",
        r"'Bad Id'.*phase 'warmup'",
        r"'Bad Id'.*needles must not be empty",
        r"'Bad Id'.*pattern 0 does not compile",
        r"'Bad Id'.*first_action must be one line",
        r"'Bad Id'.*unknown key 'extra_key'",
        r"'ok.one'.*cascade has category 'cascade'",
        r"'ok.one'.*missing key 'phases'",
        r"'ok.one': duplicate id",
        r"xid '79'.*bucket 'broken'",
        r"xid 'abc'.*decimal number",
        r"'ok.two'.*greater must be two group names",
        r"'ok.three'.*greater names 'world', no group",
    ]
    for rx in expected:
        assert any(re.search(rx, x) for x in problems), f"missing problem {rx!r} in {problems}"
    assert str(p) in str(info.value) and len(problems) >= len(expected)


def test_unparsable_toml_is_one_clear_error():
    with pytest.raises(CatalogError, match="not valid TOML"):
        parse_catalog("[[signature]\nid =", "inline")


def test_every_trait_the_code_asks_for_is_carried():
    from firstfault.analysis.catalog import TRAITS
    for trait in TRAITS:
        assert CATALOG.ids_with(trait), trait
    with pytest.raises(KeyError):
        CATALOG.ids_with("no-such-trait")


def test_an_unknown_trait_is_refused():
    bad = '''
[[signature]]
id = "x.y"
role = "root"
category = "config"
phases = []
traits = ["progres"]
needles = ["boom"]
patterns = ["boom"]
summary = "s"
first_action = "a"
reference = "r"
examples = ["boom"]
'''
    with pytest.raises(CatalogError) as e:
        parse_catalog(bad)
    assert "trait 'progres' is not one of" in str(e.value)


def test_no_signature_id_is_written_in_the_code():
    """The code asks the catalog for traits; renaming a signature in its file can change nothing silently."""
    from pathlib import Path
    root = Path(__file__).resolve().parents[2] / "firstfault"
    ids = {s.id for s in CATALOG.signatures}
    found = [(str(p.relative_to(root)), i) for p in root.rglob("*.py") for i in ids
             if f'"{i}"' in (text := p.read_text()) or f"'{i}'" in text]
    assert found == []


def test_a_failure_glued_after_a_bar_on_its_line_is_the_line_s_signature():
    bar = "Loading checkpoint shards:  43%|████▎     | 3/7 [00:31<00:41, 10.3s/it]"
    assert CATALOG.match(bar).signature.id == "hf.loading_checkpoint_shards"
    glued = CATALOG.match(bar + "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -9) "
                          "local_rank: 0 (pid: 4100) of binary: /usr/bin/python3")
    assert (glued.signature.id, glued.role) == ("torchelastic.worker_sigkill", "root")


def test_a_last_resort_does_not_take_a_line_from_a_context_signature():
    line = ("torch.multiprocessing.spawn.ProcessExitedException: process 1 terminated with exit code 1")
    m = CATALOG.match(line)
    assert (m.signature.id, m.role) == ("torchelastic.worker_failed", "context")  # not python.exception
