"""Run one real DeepSpeed failure scenario (tests/realjobs/train.py) into a folder.

    python tests/realjobs/run.py --list
    python tests/realjobs/run.py torchrun-oom-rank1-of-2 /tmp/out      # needs root for oom
    python tests/realjobs/run.py --all /tmp/real                        # one folder per scenario

The job runs with the folder as its working directory, so every path in its logs is
relative (``logs/…``, ``checkpoints/global_step4/…``) and a copied folder stays true to
its logs. What the folder holds afterwards:

- ``launcher.log``: the launcher's own stdout and stderr, merged. torchrun runs with
  ``--tee 3``, so this is also the interleaved console a user would paste.
- ``logs/``: per-rank logs. torchrun ``--log-dir logs --redirects 3`` makes
  ``logs/<run id>/attempt_0/<local rank>/{stdout,stderr}.log`` (+ ``error.json`` from
  ``@record``); deepspeed ``--enable_each_rank_log logs`` makes ``logs/<stamp>_rank<N>.log``.
- ``checkpoints/``: what ``engine.save_checkpoint`` wrote (tags, ``latest``).
- ``kmsg.txt``, ``dmesg.txt``, ``dmesg-T.txt`` (OOM scenarios): the kernel's messages of
  the job window. ``kmsg.txt`` holds the raw ``/dev/kmsg`` records
  (``prio,seq,usec,flags;text`` plus continuation lines) read after the last record that
  existed before the job; the two dmesg files hold the same records as ``dmesg`` and
  ``dmesg -T`` print them. Other processes' messages of that window are in them too.
  ``scenario.json`` keeps a clock sample taken at capture (``result.kmsg.clock``) to turn
  record times into wall time exactly.
- ``scenario.json``: the ground truth (``expected`` uses the vocabularies of
  /work/shared/REPORT.md; ``null`` means "not asserted"), the command line, versions and
  what the run returned.

Importable: ``SCENARIOS``, ``run_scenario(name, out_dir)``, ``ensure_comm_op()``.
The OOM scenarios need root and cgroup v1's memory controller: the runner makes
``/sys/fs/cgroup/memory/firstfault-test-<id>`` with a small ``memory.limit_in_bytes``, the
failing rank moves itself into it, and the runner removes it afterwards.
"""

import argparse
import dataclasses
import datetime
import importlib.util
import json
import os
import platform
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TRAIN = HERE / "train.py"
DEFAULT_EXTENSIONS_DIR = "/var/cache/firstfault/torch_extensions"
SCHEMA = "firstfault.realjob/1"


@dataclasses.dataclass(frozen=True)
class Scenario:
    """One real job: how to launch it, what to break, and what the report should say."""
    name: str
    launcher: str  # "torchrun" | "deepspeed"
    nproc: int
    fail: str = "none"
    fail_rank: int | None = None
    fail_step: int | None = None
    steps: int = 6
    save_every: int = 2
    zero_stage: int = 2
    timeout_s: float = 20.0  # init_distributed's timeout: the world group's collectives
    save: bool = True  # pass --save-dir checkpoints
    keep_rank_logs: bool = True  # False: delete logs/ afterwards, keep launcher.log (a pasted console)
    oom_limit_bytes: int = 1 << 30
    ds_config: dict | None = None  # written to ds_config.json and passed as --ds-config (no --zero-stage then)
    cancel_after_step: int | None = None  # SIGTERM the whole job once rank 0 printed this step (a time limit)
    step_pause_s: float = 0.0  # each step lasts at least this long: a cancel at a step lands before the next ones
    memory_breakdown: bool = False  # DeepSpeed's "memory_breakdown": see_memory_usage around each step's parts
    expected: dict = dataclasses.field(default_factory=dict)
    truth: str = ""
    train_extra: tuple = ()  # more train.py options (--faulthandler, --abort-on-collective-error, ...)
    sigterm_after: str | None = None  # once launcher.log holds this text, SIGTERM the launcher...
    sigterm_delay_s: float = 3.0  # ...this long after (a job killed from outside: scancel, a time limit)
    nodes: int = 1  # torchrun agents (static rendezvous on this host), each with its own folder node<i>/
    kernel: bool = False  # capture the kernel's messages of the job's window (needs root)

    @property
    def needs_root(self):
        return self.fail == "oom" or self.kernel

    @property
    def analyze_paths(self):
        """What to give `firstfault analyze` for this folder: NODE=DIR for per-node folders."""
        return [f"node{i}=node{i}" for i in range(self.nodes)] if self.nodes > 1 else ["."]


def _logs_only(verdict, resume_from):
    """What the logs alone (no checkpoint folder) prove of the checkpoint."""
    return dict(checkpoint_verdict=verdict, checkpoint_resume_from=resume_from)


def _expect(rank, category, phase, blame, verdict, resume_from, **more):
    return dict(rank=rank, category=category, phase=phase, blame=blame, checkpoint_verdict=verdict,
                checkpoint_resume_from=resume_from, **more)


SCENARIOS = {
    s.name: s
    for s in [
        Scenario(
            "torchrun-clean-2", "torchrun", 2,
            # torchrun logs nothing of a clean exit (at its default log level): the logs alone show
            # global_step4 finished (both ranks logged step 5), not whether rank 1 finished global_step6.
            expected=dict(failed=False, checkpoint_verdict="safe", checkpoint_resume_from="global_step6",
                          logs_only=_logs_only("unknown", "global_step4")),
            truth="No failure: 6 steps, checkpoints at steps 2, 4, 6, every rank exits 0."),
        Scenario(
            "torchrun-exception-rank1-of-2", "torchrun", 2, "exception", 1, 5,
            expected=_expect(1, "user-code", "forward", "code", "safe", "global_step4",
                             logs_only=_logs_only("safe", "global_step4")),
            truth="Rank 1 raises ValueError in the model's forward (check_features) at step 5; "
            "rank 0 waits in the loss all_reduce and fails with a gloo peer error."),
        Scenario(
            "torchrun-pasted-exception-rank2-of-4", "torchrun", 4, "exception", 2, 3, save=False,
            keep_rank_logs=False,
            expected=_expect(2, "user-code", "forward", "code", "unknown", None),
            truth="A pasted console: only the torchrun --tee output, four ranks interleaved. Rank 2 "
            "raises ValueError in forward at step 3; no checkpoints were configured."),
        Scenario(
            "deepspeed-exception-rank2-of-4", "deepspeed", 4, "exception", 2, 5,
            expected=_expect(2, "user-code", "forward", "code", "safe", "global_step4",
                             logs_only=_logs_only("safe", "global_step4")),
            truth="Rank 2 of 4 raises ValueError in forward at step 5 under the deepspeed launcher."),
        Scenario(
            "torchrun-oom-rank1-of-2", "torchrun", 2, "oom", 1, 5,
            expected=_expect(1, "host-memory", "optimizer-step", "resources", "safe", "global_step4",
                             signal="SIGKILL", phase_witness="survivor-stacks",
                             logs_only=_logs_only("safe", "global_step4")),
            truth="Rank 1 allocates host memory in its optimizer step at step 5 inside a 1 GiB "
            "memory cgroup; the kernel's memcg OOM killer SIGKILLs it (no traceback)."),
        Scenario(
            "deepspeed-oom-rank1-of-2", "deepspeed", 2, "oom", 1, 5,
            expected=_expect(1, "host-memory", "optimizer-step", "resources", "safe", "global_step4",
                             signal="SIGKILL", phase_witness="survivor-stacks",
                             logs_only=_logs_only("safe", "global_step4")),
            truth="As torchrun-oom-rank1-of-2, under the deepspeed launcher."),
        Scenario(
            "torchrun-oom-memory-rank1-of-2", "torchrun", 2, "oom", 1, 5, memory_breakdown=True,
            expected=_expect(1, "host-memory", "optimizer-step", "resources", "safe", "global_step4",
                             signal="SIGKILL", phase_witness="survivor-stacks",
                             logs_only=_logs_only("safe", "global_step4")),
            truth="As torchrun-oom-rank1-of-2 with DeepSpeed's memory_breakdown on: rank 0 prints "
            "see_memory_usage (MA/Max_MA/CA/Max_CA, CPU virtual memory) before and after each "
            "forward, backward and step (memory by phase)."),
        Scenario(
            "torchrun-kill-in-save-rank1-of-2", "torchrun", 2, "kill-in-save", 1, 4, kernel=True,
            # A SIGKILL, and the node's kernel log of the job's window shows no OOM kill: not memory,
            # and nothing says who sent it.
            expected=_expect(1, "unknown", "checkpoint-save", "unknown", "unsafe", "global_step2",
                             signal="SIGKILL", incomplete_tag="global_step4",
                             logs_only=_logs_only("unsafe", "global_step2")),
            truth="Rank 1 writes half of its ZeRO optimizer shard of global_step4 and SIGKILLs itself; "
            "rank 0 has written its shards and `latest` (= global_step4) and fails in the closing barrier. "
            "The kernel log of the job's window (bracketed by the runner's own kmsg lines) holds no OOM kill."),
        Scenario(
            "torchrun-hang-rank1-of-2", "torchrun", 2, "hang", 1, 3,
            # Only cascades exist; the analysis must infer rank 1 from its missing progress.
            # Where it hangs (its data loader) is not in any log: phase is not asserted.
            expected=_expect(1, "unknown", None, "unknown", "safe", "global_step2",
                             logs_only=_logs_only("safe", "global_step2")),
            truth="Rank 1's data loader blocks forever at step 3; rank 0 times out in the world-group "
            "loss all_reduce after 20 s (gloo), exits 1, and torchrun SIGTERMs rank 1."),
        Scenario(
            "torchrun-sigterm-hang-rank1-of-3", "torchrun", 3, "hang", 1, 3, timeout_s=300.0,
            train_extra=("--faulthandler",), sigterm_after="[default0]:rank 0 step 2 ",
            # Killed from outside while rank 1 sat in its data loader and ranks 0, 2 waited in the
            # loss all_reduce: no rank raised; the faulthandler dumps show who was elsewhere.
            expected=_expect(1, "unknown", "data", "unknown", "safe", "global_step2",
                             logs_only=_logs_only("safe", "global_step2")),
            truth="Rank 1's data loader blocks at step 3 while ranks 0 and 2 wait in the loss all_reduce "
            "(300 s timeout); the runner SIGTERMs torchrun (as scancel or a time limit does), torchrun "
            "SIGTERMs the workers, and each dumps its stacks (faulthandler) before it dies."),
        Scenario(
            "torchrun-never-reach-rank3-of-4", "torchrun", 4, "hang", 3, 3, timeout_s=15.0,
            expected=_expect(3, "unknown", None, "unknown", "safe", "global_step2",
                             logs_only=_logs_only("safe", "global_step2")),
            truth="Rank 3 never reaches the step-3 loss all_reduce (its data loader blocks); ranks 0-2 "
            "time out in it (gloo, 15 s) and torchrun SIGTERMs rank 3."),
        Scenario(
            "torchrun-abort-after-timeout-rank1-of-2", "torchrun", 2, "hang", 1, 3, timeout_s=15.0,
            train_extra=("--abort-on-collective-error",),
            # Rank 0 dies of SIGABRT (-6) after its timeout, as an NCCL watchdog abort does: a cascade.
            expected=_expect(1, "unknown", None, "unknown", "safe", "global_step2",
                             logs_only=_logs_only("safe", "global_step2")),
            truth="Rank 1's data loader blocks at step 3; rank 0 times out in the loss all_reduce (gloo, "
            "15 s), prints the error and aborts (SIGABRT, exit -6), as ranks do whose NCCL watchdog "
            "takes the process down after a collective timeout; torchrun SIGTERMs rank 1."),
        Scenario(
            "torchrun-2node-exception-rank2-of-4", "torchrun", 2, "exception", 2, 5, nodes=2,
            expected=_expect(2, "user-code", "forward", "code", "safe", "global_step4", node="node1",
                             logs_only=_logs_only("safe", "global_step4")),
            truth="Two torchrun agents (static rendezvous on this host, 2 ranks each) log into their own "
            "folders node0/ and node1/; rank 2 (node1, local rank 0) raises ValueError in forward at step 5."),
        Scenario(
            "deepspeed-clean-2", "deepspeed", 2,
            expected=dict(failed=False, checkpoint_verdict="safe", checkpoint_resume_from="global_step6",
                          logs_only=_logs_only("safe", "global_step6")),
            truth="No failure under the deepspeed launcher: 6 steps, checkpoints at 2, 4, 6; the launcher "
            "logs `Process <pid> exits successfully.` for each rank."),
        Scenario(
            "deepspeed-bad-config-2", "deepspeed", 2, "bad-config",
            # Every rank fails the same way; which one comes first is a race.
            expected=_expect(None, "config", "init", "config", "unknown", None, ranks_sharing=[0, 1]),
            truth="The ZeRO section has a misspelled key (reduce_bucket_sizee): pydantic rejects it at "
            "deepspeed.initialize on every rank; no step runs, no checkpoint exists."),
        Scenario(
            "torchrun-nan-rank1-of-2", "torchrun", 2, "nan", 1, 3,
            # The inf enters on rank 1, but every rank sees the averaged NaN and stops the same way.
            expected=_expect(None, "numerics", "forward", "numerics", "safe", "global_step2",
                             ranks_sharing=[0, 1],
                             logs_only=_logs_only("safe", "global_step2")),
            truth="Rank 1's batch carries an inf at step 3; the all-reduced loss is NaN on every rank and "
            "each raises FloatingPointError from the script's own check."),
    ]
}


# --- retries: a failing run and four retries, for `firstfault compare` ---------------


def retry_config(stage, micro_batch=8, bf16=False):
    """The DeepSpeed config of the retry scenarios; each retry changes only what it names."""
    cfg = {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": 1,
        "steps_per_print": 1,
        "log_level": "info",
        "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}},
        # persistence 0: ZeRO-3 partitions even this tiny model's parameters
        "zero_optimization": {"stage": stage, "reduce_bucket_size": 5e5, "stage3_param_persistence_threshold": 0},
    }
    if bf16:
        cfg["bf16"] = {"enabled": True}
    return cfg


def _retry(name, ds_config, expected, truth, **more):
    # The same command every time: rank 0's forward probes fc1.weight directly at step 5.
    return Scenario(name, "deepspeed", 2, "param-probe", 0, 5, ds_config=ds_config, expected=expected, truth=truth,
                    **more)


_PROBE_FAILS = _expect(0, "user-code", "forward", "code", "safe", "global_step4")
RETRY_SCENARIOS = {
    s.name: s
    for s in [
        _retry("retry-0-zero3-probe-fails", retry_config(3), _PROBE_FAILS,
               "ZeRO stage 3: at step 5 rank 0's forward computes a diagnostic from fc1.weight directly, which "
               "ZeRO-3 keeps partitioned (an empty tensor) outside fc1's own forward: RuntimeError on rank 0, "
               "rank 1 loses its peer. The run the retries are compared with."),
        _retry("retry-1-zero2-fixed", retry_config(2),
               dict(failed=False, checkpoint_verdict="safe", checkpoint_resume_from="global_step6"),
               "One setting changed: ZeRO stage 3 -> 2 (parameters whole). The probe works; 6 steps, saves at "
               "2, 4, 6."),
        _retry("retry-2-micro-batch-4-fails-again", retry_config(3, micro_batch=4), _PROBE_FAILS,
               "One setting changed, the wrong one: micro batch 8 -> 4 under ZeRO stage 3. The same RuntimeError "
               "at step 5 on rank 0."),
        _retry("retry-3-three-changes", retry_config(2, micro_batch=4, bf16=True),
               dict(failed=False, checkpoint_verdict="safe", checkpoint_resume_from="global_step6"),
               "Three settings changed at once: ZeRO stage 3 -> 2, micro batch 8 -> 4, precision fp32 -> bf16. "
               "It passes, but which change fixed it is unknown."),
        _retry("retry-4-cancelled-at-step-3", retry_config(2),
               dict(failed=None, checkpoint_verdict=None, checkpoint_resume_from=None),
               "One setting changed (ZeRO stage 3 -> 2), but the job was cancelled as a time limit does: "
               "SIGTERM to all its processes once rank 0 printed step 3, before step 5 where the first run "
               "failed.", cancel_after_step=3, step_pause_s=2.0),
    ]
}
# case -> (BEFORE, AFTER, the verdict `firstfault compare` must give)
COMPARISONS = {
    "fixed": ("retry-0-zero3-probe-fails", "retry-1-zero2-fixed", "fixed"),
    "not-fixed": ("retry-0-zero3-probe-fails", "retry-2-micro-batch-4-fails-again", "not-fixed"),
    "three-changes": ("retry-0-zero3-probe-fails", "retry-3-three-changes", "inconclusive"),
    "stopped-early": ("retry-0-zero3-probe-fails", "retry-4-cancelled-at-step-3", "inconclusive"),
}
ALL_SCENARIOS = {**SCENARIOS, **RETRY_SCENARIOS}


def extensions_env(env=None):
    """The environment a rank runs with: CPU accelerator, cached torch extensions."""
    env = dict(os.environ if env is None else env)
    env.setdefault("DS_ACCELERATOR", "cpu")
    env.setdefault("TORCH_EXTENSIONS_DIR", DEFAULT_EXTENSIONS_DIR)
    return env


_COMM_OP_READY = False


def ensure_comm_op(env=None):
    """Build DeepSpeed's CPU comm op once, before ranks start building it in parallel."""
    global _COMM_OP_READY
    if _COMM_OP_READY:
        return
    env = extensions_env(env)
    Path(env["TORCH_EXTENSIONS_DIR"]).mkdir(parents=True, exist_ok=True)
    code = "from deepspeed.comm.torch import build_shm_op; build_shm_op()"
    subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, timeout=900)
    _COMM_OP_READY = True


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _bin(name):
    path = Path(sys.executable).parent / name
    return str(path) if path.exists() else shutil.which(name) or name


def train_args(sc, cgroup=None):
    args = ["--steps", str(sc.steps)]
    if sc.ds_config is None:
        args += ["--zero-stage", str(sc.zero_stage)]
    args += ["--timeout", str(sc.timeout_s), "--fail", sc.fail]
    if sc.save:
        args += ["--save-dir", "checkpoints", "--save-every", str(sc.save_every)]
    if sc.fail_rank is not None:
        args += ["--fail-rank", str(sc.fail_rank)]
    if sc.fail_step is not None:
        args += ["--fail-step", str(sc.fail_step)]
    if cgroup is not None:
        args += ["--oom-cgroup", str(cgroup)]
    if sc.ds_config is not None:
        args += ["--ds-config", "ds_config.json"]
    if sc.memory_breakdown:
        args += ["--memory-breakdown"]
    if sc.step_pause_s:
        args += ["--step-pause", str(sc.step_pause_s)]
    return args + list(sc.train_extra)


def command(sc, cgroup=None, node=0, port=None):
    """The launcher command line (of agent ``node`` for a multi-node run), to run in the scenario's folder."""
    if sc.launcher == "torchrun" and sc.nodes > 1:
        # Static rendezvous: node i holds global ranks i*nproc ... (i+1)*nproc-1.
        cmd = [_bin("torchrun"), "--nnodes", str(sc.nodes), "--node_rank", str(node), "--master_addr",
               "127.0.0.1", "--master_port", str(port), "--nproc_per_node", str(sc.nproc),
               "--log-dir", f"node{node}/logs", "--redirects", "3", "--tee", "3"]
    elif sc.launcher == "torchrun":
        # Always --log-dir: without it torchrun leaves a torchelastic_* folder in /tmp.
        cmd = [_bin("torchrun"), "--standalone", "--nproc_per_node", str(sc.nproc), "--log-dir", "logs",
               "--redirects", "3", "--tee", "3"]
    elif sc.launcher == "deepspeed":
        cmd = [_bin("deepspeed"), "--num_gpus", str(sc.nproc), "--master_port", str(_free_port()),
               "--enable_each_rank_log", "logs"]
    else:
        raise ValueError(f"unknown launcher {sc.launcher!r}: use torchrun or deepspeed")
    return cmd + [str(TRAIN)] + train_args(sc, cgroup)


def _sibling(name):
    """A module next to this file, loaded by path (this file runs as a script and is loaded by path)."""
    spec = importlib.util.spec_from_file_location(f"firstfault_realjobs_{name}", HERE / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


capture = _sibling("capture")
CGROUP_V1_MEMORY = capture.CGROUP_V1_MEMORY


SHM = Path("/dev/shm")
SHM_LEFTOVERS = "deepspeed_allreduce_buffer_*"  # DeepSpeed's CPU shm all-reduce: ~66 MB a rank


def _shm_leftovers() -> set[Path]:
    return set(SHM.glob(SHM_LEFTOVERS)) if SHM.is_dir() else set()


def _in_use(paths: set[Path]) -> set[Path]:
    """Those of ``paths`` a live process maps or holds open: another job's, running beside this one
    (the live-node test runs two). DeepSpeed's shm_initialize creates its rank's buffer, fills it
    with write() (66 MB: long enough to be seen unmapped on a busy machine), maps it, and then
    waits, without end, for each other rank's to exist: removing a running job's buffer hangs that
    job."""
    if not paths:
        return set()
    names = {str(p) for p in paths}
    used: set[str] = set()
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            used |= {n for n in names if n in (proc / "maps").read_text()}
            for fd in (proc / "fd").iterdir():
                target = os.readlink(fd)
                if target in names:
                    used.add(target)
        except OSError:
            continue
    return {Path(n) for n in used}


def _launch(sc, cmds, out, env, timeout_s, result):
    """Start the launcher(s) (each its own launcher.log), SIGTERM them when the scenario says,
    and return the exit code (of node 0's launcher, the others in result["launcher_exit_codes"]).
    The shared-memory buffers DeepSpeed's ranks never unlink (clean exit or killed) are removed
    afterwards: 30 jobs left 3.7 GB of /dev/shm per test run. Not those a live process maps or holds
    open: another job's, started while this one ran (_in_use)."""
    logs, procs, shm_before = [], [], _shm_leftovers()
    try:
        for node, cmd in enumerate(cmds):
            where = out / f"node{node}" if sc.nodes > 1 else out
            where.mkdir(exist_ok=True)
            logs.append(open(where / "launcher.log", "wb"))
            procs.append(subprocess.Popen(cmd, cwd=out, env=env, stdout=logs[-1], stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True))
        deadline = time.monotonic() + timeout_s
        if sc.cancel_after_step is not None:
            result["cancelled"] = cancel_at_step(procs[0], out, sc, deadline)
        if sc.sigterm_after:
            seen = _wait_for_text(out / "launcher.log", sc.sigterm_after, procs[0], deadline)
            if seen:
                time.sleep(sc.sigterm_delay_s)
                result["sigterm_sent_at"] = _now()
                procs[0].send_signal(signal.SIGTERM)  # the launcher only: it stops its workers itself
        codes = []
        for p in procs:
            try:
                codes.append(p.wait(timeout=max(1.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, 9)
                codes.append(p.wait())
                result["timed_out"] = True
    finally:
        for f in logs:
            f.close()
        left = _shm_leftovers() - shm_before
        for leftover in left - _in_use(left):
            leftover.unlink(missing_ok=True)
    if len(codes) > 1:
        result["launcher_exit_codes"] = codes
    return codes[0]


def _wait_for_text(path, text, proc, deadline):
    needle = text.encode()
    while time.monotonic() < deadline and proc.poll() is None:
        if path.exists() and needle in path.read_bytes():
            return True
        time.sleep(0.2)
    return False


# --- the run ------------------------------------------------------------------------


def versions():
    import importlib.metadata as md

    def v(pkg):
        try:
            return md.version(pkg)
        except md.PackageNotFoundError:
            return None

    return {"deepspeed": v("deepspeed"), "torch": v("torch"), "python": platform.python_version(),
            "kernel": platform.release()}


def _now():
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds")


def _rank0_log(out, launcher):
    pattern = "logs/*/attempt_0/0/stdout.log" if launcher == "torchrun" else "logs/*_rank0.log"
    return next(iter(sorted(out.glob(pattern))), None)


def cancel_at_step(proc, out, sc, deadline):
    """Once rank 0 printed step ``sc.cancel_after_step``, SIGTERM every process of the job, as a
    scheduler's time limit or scancel does; SIGKILL what is left 30 s later. Returns what was done."""
    mark = f"rank 0 step {sc.cancel_after_step} loss".encode()
    while proc.poll() is None and time.monotonic() < deadline:
        log = _rank0_log(out, sc.launcher)
        if log is not None and mark in log.read_bytes():
            at = _now()
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
            return {"after_step": sc.cancel_after_step, "signal": "SIGTERM", "to": "the job's process group", "at": at}
        time.sleep(0.05)
    return None


def run_scenario(name, out_dir, *, timeout_s=600, env=None):
    """Run scenario `name` (or a Scenario) into `out_dir` (made; must be empty). Returns scenario.json's dict."""
    sc = ALL_SCENARIOS[name] if isinstance(name, str) else name
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if any(out.iterdir()):
        raise FileExistsError(f"{out} is not empty: give run_scenario a fresh folder")
    env = extensions_env(env)
    ensure_comm_op(env)
    if sc.ds_config is not None:
        (out / "ds_config.json").write_text(json.dumps(sc.ds_config, indent=2) + "\n")
    cgroup = capture.make_cgroup(sc.oom_limit_bytes) if sc.fail == "oom" else None
    window = capture.KmsgWindow() if sc.needs_root else None
    port = _free_port()
    cmds = [command(sc, cgroup, node, port) for node in range(sc.nodes)]
    result = {"started_at": _now()}
    t0 = time.monotonic()
    try:
        if window is not None:
            capture.kmsg_mark(f"firstfault-realjob: {sc.name} starts")
        result["launcher_exit_code"] = _launch(sc, cmds, out, env, timeout_s, result)
        result["ended_at"] = _now()
        result["duration_s"] = round(time.monotonic() - t0, 2)
        time.sleep(0.5)  # let the kernel's last records land
        if window is not None:
            capture.kmsg_mark(f"firstfault-realjob: {sc.name} ended")
            result["kmsg"] = capture.capture_kernel(window, out)
            window = None
    finally:
        if window is not None:
            os.close(window.fd)
        if cgroup is not None:
            result["cgroup"] = capture.close_cgroup(cgroup)
    if not sc.keep_rank_logs:
        shutil.rmtree(out / "logs", ignore_errors=True)
    # DeepSpeed copies its own recovery scripts into the checkpoint folder: third-party
    # code, not evidence; the checkpoint checks do not need them.
    for script in (out / "checkpoints").glob("zero_to_*.py"):
        script.unlink()
    doc = {
        "schema": SCHEMA,
        "name": sc.name,
        "launcher": sc.launcher,
        "world_size": sc.nproc * sc.nodes,
        "nodes": sc.nodes,
        "analyze_paths": sc.analyze_paths,
        "node": socket.gethostname(),
        "fail": {"mode": sc.fail, "rank": sc.fail_rank, "step": sc.fail_step},
        "steps": sc.steps,
        "save_every": sc.save_every if sc.save else None,
        "zero_stage": sc.ds_config["zero_optimization"]["stage"] if sc.ds_config else sc.zero_stage,
        "timeout_s": sc.timeout_s,
        "ds_config": sc.ds_config,
        "cancel_after_step": sc.cancel_after_step,
        "pasted": not sc.keep_rank_logs,
        "truth": sc.truth,
        "expected": sc.expected,
        "command": cmds[0] if len(cmds) == 1 else cmds,
        "command_line": " & ".join(shlex.join(c) for c in cmds),
        "train_options": list(sc.train_extra),
        "sigterm_after": sc.sigterm_after,
        "cwd": "the scenario folder",
        "env": {k: env[k] for k in ("DS_ACCELERATOR", "TORCH_EXTENSIONS_DIR")},
        "versions": versions(),
        "result": result,
    }
    (out / "scenario.json").write_text(json.dumps(doc, indent=2) + "\n")
    return doc


def main(argv=None):
    p = argparse.ArgumentParser(description="Run real DeepSpeed failure scenarios on the CPU.")
    p.add_argument("name", nargs="?", help="scenario name (see --list)")
    p.add_argument("out", nargs="?", help="output folder (fresh)")
    p.add_argument("--list", action="store_true", help="list the scenarios and exit")
    p.add_argument("--all", metavar="ROOT", help="run every scenario into ROOT/<name>, one at a time")
    p.add_argument("--retries", metavar="ROOT", help="run the retry scenarios (compare) into ROOT/<name>")
    p.add_argument("--timeout", type=float, default=600, help="seconds before the job is killed")
    a = p.parse_args(argv)
    if a.list:
        for sc in ALL_SCENARIOS.values():
            print(f"{sc.name:40s} {sc.truth}")
        return 0
    if a.all:
        todo = [(n, Path(a.all) / n) for n in SCENARIOS]
    elif a.retries:
        todo = [(n, Path(a.retries) / n) for n in RETRY_SCENARIOS]
    elif a.name and a.out:
        if a.name not in ALL_SCENARIOS:
            p.error(f"unknown scenario {a.name!r}; --list shows them")
        todo = [(a.name, Path(a.out))]
    else:
        p.error("give NAME OUT, --all ROOT, --retries ROOT or --list")
    for name, out in todo:
        if ALL_SCENARIOS[name].needs_root and os.geteuid() != 0:
            print(f"{name}: skipped (needs root for the memory cgroup)", file=sys.stderr)
            continue
        doc = run_scenario(name, out, timeout_s=a.timeout)
        r = doc["result"]
        print(f"{name}: launcher exit {r['launcher_exit_code']} in {r['duration_s']} s -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
