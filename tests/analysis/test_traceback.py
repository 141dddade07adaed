"""Traceback assembly on tracebacks that a real Python 3.11 prints (made at test time)."""

import os
import subprocess
import sys
import tempfile
import textwrap

from firstfault.analysis import traceback as tb


def _stderr(code: str, *subdirs: str) -> list[str]:
    """What a real Python prints for a script (a file, so source and caret lines show), in the
    folder ``subdirs`` below a temporary one."""
    with tempfile.TemporaryDirectory() as d:
        folder = os.path.join(d, *subdirs)
        os.makedirs(folder, exist_ok=True)
        script = os.path.join(folder, "train.py")
        with open(script, "w") as f:
            f.write(textwrap.dedent(code))
        p = subprocess.run([sys.executable, script], capture_output=True, text=True)
    assert p.returncode != 0
    return p.stderr.splitlines()


def _assemble(lines: list[str]) -> tuple[tb.Traceback, list[str]]:
    start = next(i for i, ln in enumerate(lines) if tb.is_start(ln))
    asm = tb.Assembler(lines[start])
    rest = lines[start + 1 :]
    for i, ln in enumerate(rest):
        if not asm.feed(ln):
            return asm.result(), rest[i:]
    return asm.result(), []


def test_plain_with_carets():
    lines = _stderr("""
        def forward(x):
            return x["a"] + 1 / 0
        forward({"a": 1})
    """)
    assert any("^" in ln for ln in lines)  # 3.11 caret lines are there
    res, rest = _assemble(lines + ["[2026-12-02 10:00:00,000] [INFO] [x.py:1:y] next record"])
    assert res.exc_type == "ZeroDivisionError"
    assert res.message == "ZeroDivisionError: division by zero"
    assert [f.func for f in res.frames] == ["<module>", "forward"]
    assert rest == ["[2026-12-02 10:00:00,000] [INFO] [x.py:1:y] next record"]


def test_chained_keeps_all_frames_and_final_type():
    lines = _stderr("""
        def load():
            raise KeyError("k")
        def save():
            try:
                load()
            except KeyError as e:
                raise RuntimeError("save failed") from e
        save()
    """)
    res, _ = _assemble(lines)
    assert res.exc_type == "RuntimeError"
    assert "The above exception was the direct cause" in res.text
    assert {"load", "save"} <= {f.func for f in res.frames}


def test_during_handling():
    lines = _stderr("""
        try:
            {}["x"]
        except KeyError:
            None.foo
    """)
    res, _ = _assemble(lines)
    assert res.exc_type == "AttributeError"
    assert "During handling of the above exception" in res.text


def test_exception_group():
    lines = _stderr("""
        def f():
            raise ExceptionGroup("many", [ValueError("a"), TypeError("b")])
        f()
    """)
    res, _ = _assemble(lines)
    assert res.exc_type == "ExceptionGroup"
    assert "ValueError: a" in res.text and "TypeError: b" in res.text


def test_multiline_message_ends_at_next_record():
    lines = [
        "Traceback (most recent call last):",
        '  File "/x/train.py", line 5, in <module>',
        "    engine = deepspeed.initialize(config=cfg)",
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for DeepSpeedZeroConfig",
        "reduce_bucket_sizee",
        "  Extra inputs are not permitted [type=extra_forbidden, input_value=500000000.0, input_type=float]",
        "[2026-12-02 10:00:00,000] [INFO] [launch.py:1:x] next",
    ]
    res, rest = _assemble(lines)
    assert res.exc_type == "pydantic_core._pydantic_core.ValidationError"
    assert res.message.splitlines()[1] == "reduce_bucket_sizee"
    assert rest == lines[-1:]


def test_a_message_ends_where_ray_reports_a_task_error_nobody_waited_for():
    """Ray's core worker prints "Unhandled error (suppress with ...): ray::Task()" as a record of its own: the
    exception line above it (the task's own import failing) does not go on into it."""
    lines = [
        '  File "/env/site-packages/attn_ext/interface.py", line 15, in <module>',
        "    import attn_ext_cuda as gpu",
        "ImportError: /env/site-packages/attn_ext_cuda.so: undefined symbol: _ZN3c104cuda9SetDeviceEab",
        "Unhandled error (suppress with 'RAY_IGNORE_UNHANDLED_ERRORS=1'): ray::Worker.init_model() (pid=87, ip=10.0.0.2)",
    ]
    asm = tb.Assembler(lines[0])
    assert [asm.feed(ln) for ln in lines[1:]] == [True, True, False]
    assert asm.result().message == lines[2]


def test_bounded_memory_on_runaway_recursion():
    lines = _stderr("""
        def f(n):
            return f(n + 1)
        f(0)
    """)
    res, _ = _assemble(lines)
    assert res.exc_type == "RecursionError"
    assert len(res.text.splitlines()) <= tb.MAX_LINES + 1


def _stderr_deep(code: str) -> list[str]:
    """_stderr for a script whose path is long (frame lines far wider than its source lines)."""
    return _stderr(code, *(["site-packages-of-a-long-virtualenv"] * 4))


def test_frame_lines_a_terminal_wrapped_keep_the_traceback_whole():
    """A paste from a terminal or pager that wraps at its width cuts a long ``File "..."`` line in
    two: inside the path, right after its closing quote, or inside ``, line N``. The traceback goes
    on to its exception line and keeps every frame."""
    lines = _stderr_deep("""
        def step(x):
            return 1 / x
        def train():
            step(0)
        train()
    """)
    whole, _ = _assemble(lines)
    longest = max(len(ln) for ln in lines if 'File "' in ln)
    for cut in (longest - 30, 1, 7):  # inside the path; after the closing quote; after ", line"
        wrapped = []
        for ln in lines:
            if 'File "' in ln:
                at = cut if cut > 7 else ln.index('", line') + cut
                wrapped += [ln[:at], ln[at:]]
            else:
                wrapped.append(ln)
        assert len(wrapped) > len(lines)
        res, rest = _assemble(wrapped + ["[2026-12-02 10:00:00,000] [INFO] next record"])
        assert res.exc_type == "ZeroDivisionError" and rest == ["[2026-12-02 10:00:00,000] [INFO] next record"]
        assert res.frames == whole.frames


def test_a_line_that_only_looks_like_the_rest_of_a_frame_ends_a_traceback():
    asm = tb.Assembler("Traceback (most recent call last):")
    asm.feed('  File "a.py", line 1, in f')
    asm.feed("    g()")
    assert not asm.feed(", line 7, in h")  # no cut File line before it


def test_incomplete_traceback_has_no_type():
    asm = tb.Assembler("Traceback (most recent call last):")
    asm.feed('  File "a.py", line 1, in f')
    assert not asm.complete and asm.result().exc_type is None


def test_may_open_is_true_wherever_a_traceback_opens():
    """The agent's pre-check (may_open on a chunk's bytes) never misses a line where the
    grammar opens a traceback: every line of the test data, plus rich's frame border."""
    from pathlib import Path

    data = Path(__file__).resolve().parents[1] / "data"
    lines = ["╭───── Traceback (most recent call last) ─────╮",
             '│ /job/train.py:9 in <module>                  │', '  File "/job/train.py", line 9, in <module>']
    for p in data.rglob("*"):
        if p.is_file() and p.suffix in (".log", ".txt", ".json", ""):
            lines += p.read_bytes().decode("utf-8", "replace").splitlines()
    opens = [ln for ln in lines if tb.opening(tb.visible(tb.split_prefix(ln)[1])) is not None]
    assert len(opens) > 100
    assert [ln for ln in opens if not tb.may_open(ln.encode())] == []
    assert not tb.may_open(b"[rank0]: step 12 loss 0.5\n[rank1]: \"quoted\" but no frame")


def test_colour_codes_a_paste_kept_without_their_escape_byte_are_not_shown():
    """Ray colours its worker prefixes; a paste keeps the codes as "^[" (a terminal's copy of ESC) or as U+FFFD
    (the byte lost to decoding). Other text that opens like them stays."""
    for esc in ("\x1b", "^[", "\ufffd"):
        line = f"{esc}[36m(TaskRunner pid=2810778){esc}[0m   File \"/app/main.py\", line 3, in run"
        assert tb.visible(line) == "(TaskRunner pid=2810778)   File \"/app/main.py\", line 3, in run"
    assert tb.visible("grep -E '^[[:space:]]*#' x") == "grep -E '^[[:space:]]*#' x"
    assert tb.visible("a\ufffd[b] c") == "a\ufffd[b] c"


def test_a_header_glued_after_a_log_header_may_end_in_blanks():
    """vLLM's logger repeats its header on every line of a traceback; a paste may keep a blank at each line's end."""
    line = "ERROR 08-29 10:18:10 [core.py:459] Traceback (most recent call last): "
    assert tb.opening(line) == len("ERROR 08-29 10:18:10 [core.py:459] ")
    assert tb.opening("ERROR 08-29 10:18:10 [core.py:459] Traceback (most recent call last): and more") is None


def test_a_rich_frame_wrapped_in_its_panel_keeps_its_path_line_and_function():
    """rich prints a frame as "<path>:<line> in <function>" inside its panel; a path too long for the panel's width
    leaves "in <function>" for the next line. The frame is the pair, and a paste cut above the header opens on it."""
    path = "/usr/lib/python3/dist-packages/torch/distributed/fsdp/_runtime_utils.py"
    lines = [f"│ {path}:416  │", "│ in _pre_forward_unshard                                    │", "│" + " " * 60 + "│",
             "│    413 │   # If the handles have been prefetched, then there is no  │"]
    assert tb.opening(lines[0]) == 0
    asm = tb.Assembler(lines[0])
    for ln in lines[1:]:
        assert asm.feed(ln)
    assert [(f.file, f.line, f.func) for f in asm.result().frames] == [(path, 416, "_pre_forward_unshard")]
    # not examples: a source line of the panel, and a function line with no path line above it
    assert tb.opening("│    416 │   │   handle._training_state = HandleTrainingState.FORWARD      │") is None
    alone = tb.Assembler("│ /w/train.py:12 in main  │")
    alone.feed("│ in forward   │")
    assert [f.func for f in alone.result().frames] == ["main"]
