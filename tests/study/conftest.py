"""Fixtures that the study's test files share."""

from __future__ import annotations

import pytest

from normlab.study.schema import Pretrained

# -- the experiments on real (tiny) runs ----------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_pairs(tmp_path_factory):
    """Pre and post runs of 5 blocks (3 interior), 2 seeds, trained a few steps."""
    from normlab.config import load_run_config
    from normlab.train import train_run

    root = tmp_path_factory.mktemp("runs")
    out = []
    for placement in ("pre", "post"):
        for seed in (0, 1):
            cfg = load_run_config(None, [
                f"model.placement={placement}", "model.n_blocks=5", "model.d_model=32",
                "model.n_heads=2", "model.max_seq_len=64", "data.seq_len=64",
                "train.batch_size=8", "train.steps=6", "train.eval_every=0",
                "train.eval_batches=1", f"train.seed={seed}", "train.device=cpu"])
            s = train_run(cfg, root, progress=False)
            out.append(Pretrained(placement, seed, root / s["run_id"], 3.0))
    return out
