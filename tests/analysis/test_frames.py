"""analysis/frames.py: the innermost frame in the user's code and the raising frame."""

from __future__ import annotations

from firstfault.analysis.events import Frame
from firstfault.analysis.frames import failing_frame, is_user_frame, no_frame_reason

SITE = "/usr/lib/python3.11/site-packages"


def test_the_innermost_user_frame_under_the_frameworks_raising_one():
    frames = (Frame("/work/train.py", 40, "<module>"), Frame("/work/train.py", 12, "backward"),
              Frame(f"{SITE}/deepspeed/runtime/engine.py", 2100, "backward"),
              Frame(f"{SITE}/torch/_tensor.py", 626, "backward"))
    assert failing_frame(frames) == {"file": "/work/train.py", "line": 12, "function": "backward", "in_user_code": True,
                                     "raising": {"file": f"{SITE}/torch/_tensor.py", "line": 626, "function": "backward"}}


def test_frames_of_the_framework_and_the_standard_library_are_not_the_users():
    assert not is_user_frame(Frame("/opt/conda/lib/python3.10/multiprocessing/connection.py", 1, "recv"))
    assert not is_user_frame(Frame("/src/DeepSpeed/deepspeed/runtime/zero/stage3.py", 1, "step"))
    assert not is_user_frame(Frame("<frozen runpy>", 88, "_run_code"))
    assert is_user_frame(Frame("train.py", 3, "main")) and is_user_frame(Frame("/home/me/models/torchvision_like.py", 1, "f"))
    only = (Frame(f"{SITE}/torch/nn/modules/module.py", 1501, "_call_impl"),)
    assert failing_frame(only)["in_user_code"] is False and failing_frame(()) is None


def test_a_kill_or_a_native_fault_says_why_it_has_no_frame():
    assert "SIGKILL" in no_frame_reason(None, oom_kill=True)
    assert no_frame_reason("SIGKILL", oom_kill=False) == no_frame_reason(None, oom_kill=True)
    for sig in ("SIGSEGV", "SIGBUS", "SIGABRT"):
        assert "PYTHONFAULTHANDLER=1" in no_frame_reason(sig, oom_kill=False)
    # a plain exit, a polite stop or nothing known: the log may just be cut, so no excuse is made
    assert no_frame_reason(None, oom_kill=False) is None
    assert no_frame_reason("SIGTERM", oom_kill=False) is None
