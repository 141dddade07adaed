"""A tiny, real DeepSpeed training job with a failure injector.

Runs on the CPU (``DS_ACCELERATOR=cpu``, gloo) under either launcher:

    torchrun --nproc_per_node 2 tests/realjobs/train.py --steps 6 --fail exception --fail-rank 1 --fail-step 4
    deepspeed --num_gpus 2 tests/realjobs/train.py --steps 6 --fail bad-config

Each step: the rank's data loader yields a batch, the model runs forward, the loss is
averaged across ranks with an ``all_reduce`` on the world group (as scripts do to log
one loss; it is also the collective that honours ``--timeout``), then DeepSpeed's
backward and optimizer step. Every ``--save-every`` steps the engine saves a checkpoint
to ``--save-dir``. Every rank prints ``rank R step S loss L`` after each step; DeepSpeed
logs at INFO (``log_level``), on rank 0 only: ``step=S, skipped=0, lr=…`` every step and its
``timer.py`` progress line from step 3 on (``steps_per_print=1``).

Failure modes (``--fail``), on rank ``--fail-rank`` at step ``--fail-step``:

- ``exception``: the model's forward calls a user function that raises ``ValueError``
  (the traceback has user frames: ``main`` → ``train_step`` → ``TinyMLP.forward`` →
  ``check_features``).
- ``oom``: during the optimizer step the rank allocates host memory until the kernel OOM
  killer ends it. Give ``--oom-cgroup`` a cgroup v1 memory cgroup with a small
  ``memory.limit_in_bytes``: the rank moves itself into it at start-up, so the kill is the
  real kernel's memcg OOM kill.
- ``kill-in-save``: during ``save_checkpoint`` of step S the rank writes the first half of
  its ZeRO optimizer shard and SIGKILLs itself: that tag is incomplete, the previous one
  complete.
- ``stall-in-save``: during ``save_checkpoint`` of step S the rank's write of its ZeRO
  optimizer shard never returns (``stalled_write``, as a write to a hung shared mount);
  the others wait in the save's closing barrier and time out.
- ``hang``: the rank's data loader sleeps forever at step S; the survivors wait in the
  world-group loss ``all_reduce`` and time out after ``--timeout`` seconds (gloo).
- ``sleep``: the rank sleeps inside its model's forward at step S (a stuck call in the
  step); the others wait in the loss ``all_reduce`` and time out.
- ``branch``: inside its forward at step S the rank takes another branch and calls
  ``broadcast`` on the world group where the others call the loss ``all_reduce``: every
  rank waits in a different collective until the timeout.
- ``bad-config``: the ZeRO section carries a misspelled key (``reduce_bucket_sizee``):
  DeepSpeed's config validation (pydantic) fails at ``deepspeed.initialize`` on every rank.
- ``nan``: the rank's batch carries an inf at step S; the averaged loss is NaN on every
  rank, and the script stops with ``FloatingPointError`` (a user check, as scripts do).
- ``param-probe``: the model's forward computes a diagnostic from ``fc1.weight`` directly
  instead of calling ``fc1`` (``probe_scale``). That works while parameters are whole
  (ZeRO stage 0-2) and fails under ZeRO stage 3, which keeps a parameter partitioned (an
  empty tensor) outside its own module's forward: a real fault whose fix is one setting.
- ``abort``: the rank calls ``os.abort()`` at the start of step S, printing nothing: it dies
  of SIGABRT (exit -6) and its peer loses it in the loss ``all_reduce``.

``--ds-config FILE`` replaces the built-in DeepSpeed config with a JSON file, as jobs pass
theirs; retries that change a setting change only that file.

Options that change how the ranks die, not what fails:

- ``--faulthandler``: ``faulthandler.register(SIGTERM, all_threads=True, chain=True)``, so a
  rank that the launcher terminates first dumps the Python stack of every thread (what
  jobs do to see where a killed job was), then dies of the SIGTERM.
- ``--abort-on-collective-error``: a rank whose loss ``all_reduce`` raises (a timeout, a lost
  peer) prints the traceback and calls ``os.abort()``: it dies of SIGABRT (exit -6), as a
  rank does whose NCCL watchdog tears the process down after a collective timeout.
"""

import argparse
import faulthandler
import os
import signal
import sys
import time
import traceback


def join_oom_cgroup(argv):
    """Move the failing rank into the OOM scenario's memory cgroup.

    Done before torch is imported, so the cgroup is charged for the whole rank. Both
    launchers set ``RANK`` in each worker's environment.
    """
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--oom-cgroup")
    pre.add_argument("--fail-rank", type=int, default=1)
    known, _ = pre.parse_known_args(argv)
    if known.oom_cgroup and os.environ.get("RANK") == str(known.fail_rank):
        with open(os.path.join(known.oom_cgroup, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))


join_oom_cgroup(sys.argv[1:])

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("TORCH_EXTENSIONS_DIR", "/var/cache/firstfault/torch_extensions")

import datetime  # noqa: E402
import json  # noqa: E402

import deepspeed  # noqa: E402
import deepspeed.comm as dist  # noqa: E402
import torch  # noqa: E402
from torch.optim.optimizer import register_optimizer_step_pre_hook  # noqa: E402

FAIL_MODES = ("none", "exception", "oom", "kill-in-save", "stall-in-save", "hang", "sleep", "branch", "bad-config",
              "nan", "param-probe", "abort")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--local_rank", "--local-rank", type=int, default=-1, help="set by the deepspeed launcher")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--zero-stage", type=int, default=2, choices=(0, 1, 2, 3))
    p.add_argument("--save-dir", default=None, help="checkpoint directory (no checkpoints when unset)")
    p.add_argument("--save-every", type=int, default=2)
    p.add_argument("--timeout", type=float, default=20.0, help="init_distributed timeout, seconds")
    p.add_argument("--fail", choices=FAIL_MODES, default="none")
    p.add_argument("--fail-rank", type=int, default=1)
    p.add_argument("--fail-step", type=int, default=3)
    p.add_argument("--oom-cgroup", default=None, help="cgroup v1 memory cgroup the failing rank joins (at import)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--ds-config", default=None, help="DeepSpeed config JSON file (default: the built-in one)")
    p.add_argument("--memory-breakdown", action="store_true", help='DeepSpeed "memory_breakdown": true')
    p.add_argument("--faulthandler", action="store_true",
                   help="faulthandler dumps every thread's stack to stderr on SIGTERM (then the rank dies)")
    p.add_argument("--abort-on-collective-error", action="store_true",
                   help="os.abort() when the loss all_reduce raises (exit -6, as an NCCL watchdog abort)")
    p.add_argument("--step-pause", type=float, default=0.0,
                   help="seconds each step lasts at least (a real model's step takes seconds, this one's milliseconds)")
    return p.parse_args(argv)


class Injector:
    """Knows the failing rank and step; every injection goes through it."""

    def __init__(self, args, rank):
        self.mode = args.fail
        self.here = rank == args.fail_rank
        self.step_at = args.fail_step
        self.step = 0

    def active(self, mode):
        return self.mode == mode and self.here and self.step == self.step_at


def check_features(x, injector):
    """A user-side sanity check in the forward path."""
    if injector.active("sleep"):
        time.sleep(3600)  # a call inside the step that never returns
    if injector.active("branch"):
        dist.broadcast(x.sum().detach().reshape(1), 0)  # another branch, another collective
    if injector.active("exception"):
        raise ValueError(f"feature vector has {x.shape[-1] + 1} columns, expected {x.shape[-1]} "
                         f"(bad record in batch at step {injector.step})")
    return x


def probe_scale(x, layer, injector):
    """A user-side diagnostic: the layer's pre-activation scale, from its weight directly
    rather than by calling the layer (under ZeRO-3 the weight is an empty partition here)."""
    scale = torch.nn.functional.linear(x, layer.weight, layer.bias).std()
    print(f"step {injector.step} fc1 pre-activation std {scale.item():.4f}", flush=True)


class TinyMLP(torch.nn.Module):

    def __init__(self, injector, d_in=16, d_hidden=32, d_out=4):
        super().__init__()
        self.injector = injector
        self.fc1 = torch.nn.Linear(d_in, d_hidden)
        self.fc2 = torch.nn.Linear(d_hidden, d_out)

    def forward(self, x):
        x = check_features(x, self.injector)
        if self.injector.active("param-probe"):
            probe_scale(x, self.fc1, self.injector)
        return self.fc2(torch.relu(self.fc1(x)))


class Batches:
    """An endless synthetic data loader, different on every rank."""

    def __init__(self, rank, injector, batch_size, dtype, d_in=16, d_out=4, seed=1234):
        self.gen = torch.Generator().manual_seed(seed + rank)
        self.dtype = dtype  # the model's: a bf16 model takes bf16 inputs
        self.injector = injector
        self.shape = (batch_size, d_in)
        self.d_out = d_out

    def __iter__(self):
        return self

    def __next__(self):
        if self.injector.active("hang"):
            while True:  # a stuck read: the process lives, the step never comes
                time.sleep(3600)
        x = torch.randn(self.shape, generator=self.gen).to(self.dtype)
        y = torch.randint(0, self.d_out, (self.shape[0], ), generator=self.gen)
        if self.injector.active("nan"):
            x[0, 0] = float("inf")
        return x, y


def ds_config(args):
    if args.ds_config:
        with open(args.ds_config) as f:
            return json.load(f)
    zero = {"stage": args.zero_stage, "reduce_bucket_size": 5e5}
    if args.fail == "bad-config":
        zero = {"stage": args.zero_stage, "reduce_bucket_sizee": 5e5}
    return {
        "train_micro_batch_size_per_gpu": 8,
        "gradient_accumulation_steps": 1,
        "steps_per_print": 1,
        "log_level": "info",  # DeepSpeed 0.19.8 logs at WARNING unless told: we want its INFO lines
        "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}},
        "zero_optimization": zero,
        **({"memory_breakdown": True} if args.memory_breakdown else {}),
    }


def install_oom(injector):
    """Allocate host memory inside the optimizer step of the failing step, until killed."""

    def hook(optimizer, args, kwargs):
        if not injector.active("oom"):
            return
        hoard = []
        while True:
            hoard.append(bytearray(b"\x5a") * (64 << 20))  # touches every page

    register_optimizer_step_pre_hook(hook)


def stalled_write():
    time.sleep(3600)  # a write that never returns: a hung shared mount


def install_kill_in_save(injector):
    """Write half of this rank's ZeRO shard of the failing step, then SIGKILL ourselves
    (``kill-in-save``); or never return from writing it (``stall-in-save``)."""
    real_save = torch.save

    def save(obj, f, *a, **kw):
        shard = isinstance(f, str) and "optim_states" in f
        if injector.active("kill-in-save") and shard:
            real_save(obj, f, *a, **kw)  # then keep the first half: what a write cut short leaves
            with open(f, "r+b") as out:
                out.truncate(os.fstat(out.fileno()).st_size // 2)
                os.fsync(out.fileno())
            os.kill(os.getpid(), signal.SIGKILL)
        if injector.active("stall-in-save") and shard:
            stalled_write()
        return real_save(obj, f, *a, **kw)

    torch.save = save


def train_step(engine, batch, injector, abort_on_error=False):
    x, y = batch
    if injector.active("abort"):  # dies of SIGABRT before the loss all_reduce, printing nothing
        os.abort()
    out = engine(x)
    loss = torch.nn.functional.cross_entropy(out, y)
    avg = loss.detach().clone()
    try:
        dist.all_reduce(avg)  # world group: honours init_distributed's timeout
    except RuntimeError:
        if not abort_on_error:
            raise
        traceback.print_exc()
        sys.stderr.flush()
        os.abort()
    avg /= dist.get_world_size()
    if not torch.isfinite(avg):
        raise FloatingPointError(f"loss is {avg.item()} at step {injector.step}")
    engine.backward(loss)
    engine.step()
    return avg.item()


def install_fr_dump(rank):
    """With ``TORCH_FR_BUFFER_SIZE`` and ``TORCH_FR_DUMP_TEMP_FILE`` set, write torch's own Flight
    Recorder dump to ``<prefix><rank>`` when a collective raises and on SIGTERM (then die of it):
    what NCCL's dump-on-timeout does on every rank; gloo has no dump of its own. Returns the
    dump function, None when off."""
    prefix = os.environ.get("TORCH_FR_DUMP_TEMP_FILE")
    if not prefix or not os.environ.get("TORCH_FR_BUFFER_SIZE"):
        return None
    from torch._C._distributed_c10d import _dump_fr_trace

    def dump():
        with open(f"{prefix}{rank}", "wb") as f:
            f.write(_dump_fr_trace())

    def on_term(signum, frame):
        dump()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    signal.signal(signal.SIGTERM, on_term)
    return dump


def main(argv=None):
    args = parse_args(argv)
    deepspeed.init_distributed(dist_backend="gloo", timeout=datetime.timedelta(seconds=args.timeout))
    rank = dist.get_rank()
    dump_fr = install_fr_dump(rank)
    if args.faulthandler:  # after a Python SIGTERM handler (the Flight Recorder's): chained, it runs after the dump
        faulthandler.register(signal.SIGTERM, all_threads=True, chain=True)
    injector = Injector(args, rank)
    torch.manual_seed(args.seed)
    install_oom(injector)
    install_kill_in_save(injector)
    model = TinyMLP(injector)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config(args))
    dtype = torch.bfloat16 if engine.bfloat16_enabled() else torch.float32
    batches = Batches(rank, injector, engine.train_micro_batch_size_per_gpu(), dtype, seed=args.seed)
    try:
        for step in range(1, args.steps + 1):
            injector.step = step
            loss = train_step(engine, next(batches), injector, args.abort_on_collective_error)
            print(f"rank {rank} step {step} loss {loss:.6f}", flush=True)
            time.sleep(args.step_pause)
            if args.save_dir and step % args.save_every == 0:
                engine.save_checkpoint(args.save_dir, tag=f"global_step{step}")
    except RuntimeError:
        if dump_fr is not None:
            dump_fr()
        raise
    print(f"rank {rank} done after {args.steps} steps", flush=True)


if __name__ == "__main__":
    if "TORCHELASTIC_RUN_ID" in os.environ:  # torchrun: write error.json for the agent
        from torch.distributed.elastic.multiprocessing.errors import record
        record(main)()
    else:
        main()
