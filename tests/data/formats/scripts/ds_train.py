"""Tiny DeepSpeed job on CPU (gloo). usage (under the deepspeed launcher):
  ds_train.py --mode {lossscale,raise} [--stage N]
  lossscale - fp16 (ZeRO stage N) with dynamic loss scaling; the loss is made inf every step, so the scaler
              keeps halving from 2**4 until min_loss_scale=1 and DeepSpeed gives up
  raise     - bf16 ZeRO stage N; global rank 1 raises at step 3
  branch    - bf16 ZeRO stage 3 with a data-dependent branch (a submodule used only on even steps)
"""
import argparse
import os

import deepspeed
import torch


class Branchy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(16, 32)
        self.fc2 = torch.nn.Linear(32, 32)
        self.fc3 = torch.nn.Linear(32, 1)

    def forward(self, x, use_fc2):
        x = torch.relu(self.fc1(x))
        if use_fc2:
            x = torch.relu(self.fc2(x))
        return self.fc3(x)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", default="raise")
    p.add_argument("--stage", type=int, default=2)
    p.add_argument("--local_rank", type=int, default=-1)
    args = p.parse_args()

    torch.manual_seed(0)
    if args.mode == "branch":
        model = Branchy()
    else:
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    cfg = {
        "train_micro_batch_size_per_gpu": 4,
        "steps_per_print": 1,
        "log_level": "info",
        "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}},
        "zero_optimization": {"stage": args.stage},
    }
    if args.mode == "lossscale":
        # DeepSpeed's CPU accelerator reports no fp16 support; claim it so the real fp16
        # dynamic loss scaler runs (CPU torch can do the fp16 Linear/Adam math).
        from deepspeed.accelerator import get_accelerator
        get_accelerator().is_fp16_supported = lambda: True
        cfg["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 4,
                       "loss_scale_window": 1000, "hysteresis": 1, "min_loss_scale": 1}
    else:
        cfg["bf16"] = {"enabled": True}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    rank = int(os.environ.get("RANK", "0"))
    dtype = next(engine.module.parameters()).dtype
    for step in range(1, 11):
        x = torch.randn(4, 16, dtype=dtype)
        y = torch.randn(4, 1, dtype=dtype)
        out = engine(x, step % 2 == 0) if args.mode == "branch" else engine(x)
        loss = torch.nn.functional.mse_loss(out, y)
        if args.mode == "lossscale":
            loss = loss * float("inf")
        if args.mode == "raise" and rank == 1 and step == 3:
            raise RuntimeError(f"injected failure on rank {rank} at step {step}")
        engine.backward(loss)
        engine.step()
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)


if __name__ == "__main__":
    main()
