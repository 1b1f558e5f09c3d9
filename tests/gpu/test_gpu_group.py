"""A stacked group on a GPU (`normlab.train.group.train_group`, what sweeps train runs of one shape
with) against each member trained alone with `train_run` on the same GPU: the same outcomes, the
logged losses close, and the final weights close tensor by tensor, leaving out the attention key
bias (it has no gradient but rounding noise, so it drifts differently in any two
implementations: `gpu_helpers.key_bias_free`)."""

from __future__ import annotations

import pytest
from gpu_helpers import logged, needs_gpu, run_config, tensors, weight_differences

from normlab.train import read_summary, train_run
from normlab.train.group import train_group

pytestmark = needs_gpu

RUN = ["train.steps=12", "train.eval_every=6", "train.checkpoint_every=6"]
# members differing in lr, warmup, schedule, seed, clipping and weight decay
MEMBERS = [["train.lr=3e-3", "train.warmup=2"],
           ["train.lr=1e-3", "train.seed=1", "train.schedule=linear"],
           ["train.lr=1e-2", "train.warmup=5", "train.seed=2", "train.grad_clip=null",
            "train.weight_decay=0"]]
# (losses, weights): relative tolerances; bf16 rounds the matrix products of the stack and of a
# run alone differently, and the difference grows over the steps
TOLERANCE = {"fp32": (1e-3, 1e-3), "bf16": (2e-2, 5e-2)}


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_stacked_group_matches_its_separate_runs(tmp_path, precision):
    cfgs = [run_config(*RUN, *m, f"train.precision={precision}") for m in MEMBERS]
    group = train_group(cfgs, tmp_path / "group", progress=False)
    loss_rel, weight_rel = TOLERANCE[precision]
    for cfg in cfgs:
        alone = train_run(cfg, tmp_path / "alone", progress=False)
        stacked = group[cfg.run_id()]
        assert stacked["outcome"] == alone["outcome"] in ("stalled", "completed")
        assert stacked["step"] == alone["step"] == 12
        assert stacked["precision"] == alone["precision"] == precision
        a, b = tmp_path / "alone" / cfg.run_id(), tmp_path / "group" / cfg.run_id()
        la, lb = logged(a), logged(b)
        assert [r["step"] for r in la] == [r["step"] for r in lb]
        for ra, rb in zip(la, lb, strict=True):
            assert ra.keys() == rb.keys()
            for key in ("train_loss", "val_loss", "lr"):
                if key in ra:
                    assert rb[key] == pytest.approx(ra[key], rel=loss_rel), (key, ra["step"])
        diffs = weight_differences(tensors(a), tensors(b))
        worst = max(diffs, key=diffs.get)
        assert diffs[worst] <= weight_rel, (cfg.train.lr, worst, diffs[worst])
        assert read_summary(b)["precision"] == precision
