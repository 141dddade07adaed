"""Tiny GPT-2 trained with the HF Trainer on CPU with random data (no hub access).

usage: python hf_trainer.py {ok,raise,nan} OUTPUT_DIR
  ok    - 6 steps, logging_steps=1
  raise - custom compute_loss raises at global step 3
  nan   - custom compute_loss turns the loss into NaN from global step 3
  nan_nofilter - same as nan, with logging_nan_inf_filter=False
  raise_rank1  - like raise, but only on RANK 1 (run under torchrun --nproc_per_node=2)
"""
import os
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments


class RandomTokens(torch.utils.data.Dataset):
    def __init__(self, n, seq_len, vocab):
        g = torch.Generator().manual_seed(0)
        self.data = torch.randint(0, vocab, (n, seq_len), generator=g)

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return {"input_ids": self.data[i], "labels": self.data[i]}


class FaultyTrainer(Trainer):
    mode = "ok"

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        step = self.state.global_step + 1
        rank = int(os.environ.get("RANK", "0"))
        if (self.mode == "raise" or (self.mode == "raise_rank1" and rank == 1)) and step == 3:
            raise RuntimeError(f"injected failure in compute_loss at step {step}")
        if self.mode.startswith("nan") and step >= 3:
            loss = loss * float("nan")
        return loss


def main():
    mode, out = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=100, n_positions=64)
    model = GPT2LMHeadModel(cfg)
    args = TrainingArguments(
        output_dir=out,
        max_steps=6,
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=0,
        logging_nan_inf_filter=(mode != "nan_nofilter"),
    )
    FaultyTrainer.mode = mode
    trainer = FaultyTrainer(model=model, args=args, train_dataset=RandomTokens(64, 16, 100))
    trainer.train()


if __name__ == "__main__":
    main()
