"""Make the real DeepSpeed checkpoint trees under tests/data/checkpoints/.

Runs a tiny 2-rank DeepSpeed job on the CPU (DS_ACCELERATOR=cpu, gloo, torchrun)
once with ZeRO stage 2 and once with stage 3; each saves two checkpoints
(global_step2, global_step4) with ``engine.save_checkpoint``. The trees are
copied here as DeepSpeed wrote them, except RECOVERY_SCRIPTS: DeepSpeed copies
its own conversion scripts into the checkpoint root, and third-party code stays
out of this repository.

Usage (needs torch and deepspeed; see README.md for the versions used):

    python tests/data/checkpoints/make.py            # rewrites zero2/ and zero3/

The worker mode (``--worker``) is what torchrun starts on every rank.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
STAGES = (2, 3)
SAVE_AT_STEPS = (2, 4)
WORLD_SIZE = 2
# Written into the checkpoint root by DeepSpeed 0.19.8 (engine._copy_recovery_script).
RECOVERY_SCRIPTS = ("zero_to_fp32.py", "zero_to_torch.py")


def worker(stage: int, save_dir: str) -> None:
    import deepspeed
    import torch

    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "steps_per_print": 1,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}},
        "zero_optimization": {"stage": stage},
    }
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    for step in range(1, max(SAVE_AT_STEPS) + 1):
        x = torch.randn(2, 8)
        loss = engine(x).pow(2).mean()
        engine.backward(loss)
        engine.step()
        if step in SAVE_AT_STEPS:
            engine.save_checkpoint(save_dir)  # tag defaults to global_step<N>


def make(stage: int, work: Path) -> Path:
    save_dir = work / f"zero{stage}"
    env = dict(os.environ, DS_ACCELERATOR="cpu")
    env.setdefault("TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache" / "torch_extensions"))
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(WORLD_SIZE),
        "--master_port", str(29500 + stage), __file__, "--worker", "--stage", str(stage),
        "--save-dir", str(save_dir),
    ]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, env=env, check=True, timeout=600)
    return save_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--stage", type=int, choices=STAGES)
    parser.add_argument("--save-dir")
    args = parser.parse_args()
    if args.worker:
        worker(args.stage, args.save_dir)
        return
    with tempfile.TemporaryDirectory() as tmp:
        for stage in STAGES:
            made = make(stage, Path(tmp))
            for script in RECOVERY_SCRIPTS:
                (made / script).unlink(missing_ok=True)
            dest = HERE / f"zero{stage}"
            shutil.rmtree(dest, ignore_errors=True)
            shutil.copytree(made, dest)
            for path in sorted(dest.rglob("*")):
                print(path.relative_to(HERE), path.stat().st_size if path.is_file() else "")


if __name__ == "__main__":
    main()
