"""Pre and post runs trained a few steps on the CPU, as `Pretrained` pairs (the checkpoints C10
fine-tunes and C12 drops blocks of): one home for the fixtures of tests/study and
tests/finetune that need real checkpoints."""

from __future__ import annotations

from pathlib import Path

from normlab.config import load_run_config
from normlab.study.schema import Pretrained
from normlab.train import train_run


def pretrained_pairs(root: Path, blocks: int, steps: int) -> list[Pretrained]:
    """Pre and post of `blocks` blocks (width 32), seeds 0 and 1, trained `steps` steps under
    `root`; each recorded at a stand-in validation loss of 3.0."""
    out = []
    for placement in ("pre", "post"):
        for seed in (0, 1):
            cfg = load_run_config(None, [
                f"model.placement={placement}", f"model.n_blocks={blocks}", "model.d_model=32",
                "model.n_heads=2", "model.max_seq_len=64", "data.seq_len=64",
                "train.batch_size=8", f"train.steps={steps}", "train.eval_every=0",
                "train.eval_batches=1", f"train.seed={seed}", "train.device=cpu"])
            s = train_run(cfg, root, progress=False)
            out.append(Pretrained(placement, seed, root / s["run_id"], 3.0))
    return out
