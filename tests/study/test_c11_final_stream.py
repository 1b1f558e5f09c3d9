"""C11's measurements on a real trained model: the cost of dropping the final norm and the raw
final stream's RMS (the depth clause), trained and at init, against computations written here
from the model's own parts."""

from __future__ import annotations

import pytest
import torch

from normlab.config import load_run_config
from normlab.nn import build_model
from normlab.probe import text_batches
from normlab.study.experiments import final_norm_measures
from normlab.train import load_trained_model, train_run

TINY = ["model.placement=pre", "model.n_blocks=2", "model.d_model=32", "model.n_heads=2",
        "model.max_seq_len=32", "data.seq_len=32", "train.batch_size=8", "train.eval_batches=2",
        "train.eval_every=10", "train.steps=10", "train.lr=3e-3", "train.device=cpu"]


def stream_rms_by_hand(model, batches) -> float:
    """The stream after the last block, as the blocks compute it, its RMS per batch, averaged."""
    seen = []

    def keep(_module, args):
        seen.append(args[0].float().pow(2).mean().sqrt().item())

    handle = model.final.norm.register_forward_pre_hook(keep)
    with torch.no_grad():
        for x, _y in batches:
            model(x)
    handle.remove()
    return sum(seen) / len(seen)


def test_final_norm_measures_against_the_model_s_parts(tmp_path):
    cfg = load_run_config(None, TINY)
    train_run(cfg, tmp_path, progress=False)
    batches = text_batches("shakespeare", n_batches=2, batch_size=4, seq_len=32)
    got = final_norm_measures(tmp_path / cfg.run_id(), batches)

    _, trained = load_trained_model(tmp_path / cfg.run_id())
    trained.eval()
    with torch.no_grad():
        with_norm = sum(trained(x, y).loss.item() for x, y in batches) / 2
        stream = [trained.stream(x) for x, _ in batches]  # after the final norm
    assert got["with"] == pytest.approx(with_norm, rel=1e-6)
    assert got["stream_rms"] == pytest.approx(stream_rms_by_hand(trained, batches), rel=1e-6)
    # the raw stream is not the normalized one the head reads with the norm
    normed = sum(s.pow(2).mean().sqrt().item() for s in stream) / 2
    assert abs(got["stream_rms"] - normed) > 1e-3
    trained.final.norm = torch.nn.Identity()
    with torch.no_grad():
        without = sum(trained(x, y).loss.item() for x, y in batches) / 2
    assert got["without"] == pytest.approx(without, rel=1e-6)
    assert got["cost"] == pytest.approx(without - with_norm, rel=1e-6, abs=1e-9)

    at_init = build_model(cfg.model, seed=cfg.train.seed).eval()
    assert got["stream_rms_init"] == pytest.approx(stream_rms_by_hand(at_init, batches),
                                                   rel=1e-6)
    assert got["stream_rms_init"] != pytest.approx(got["stream_rms"], rel=1e-3)  # trained moved it
