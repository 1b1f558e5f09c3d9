"""The probes on a GPU: every probe (stream, gradients, merge test, layer drop, logit lens,
perturbation, update size) on a model and batches on the GPU gives the numbers it gives on the
CPU (fp32 both), at init and on a run trained on the GPU."""

from __future__ import annotations

import math

import pytest
import torch
from gpu_helpers import DEVICE, needs_gpu, run_config

from normlab.config import ModelConfig
from normlab.nn import build_model
from normlab.probe.inputs import text_batches
from normlab.probe.suite import PROBES, probe_model
from normlab.train import load_trained_model, train_run

pytestmark = needs_gpu

# counts of blocks over a threshold: a cost within rounding of the threshold may tip them
DISCRETE = ("effective_depth", "n_costly", "effective_depth_std", "n_costly_std")


def probe_on(model: torch.nn.Module, batches, device: str, probes=PROBES) -> dict:
    model = model.to(device)
    on = [(x.to(device), y.to(device)) for x, y in batches]
    return probe_model(model, on, probes, update_steps=5, seed=0)


def flat(values: list) -> list:
    """A per-block value as one list: the skip-effect matrix (a list per block) row after row."""
    return [v for row in values for v in (row if isinstance(row, list) else [row])]


def assert_close(cpu: dict, dev: dict) -> None:
    assert cpu["summary"].keys() == dev["summary"].keys()
    assert cpu["per_block"].keys() == dev["per_block"].keys()
    for key, want in cpu["summary"].items():
        got = dev["summary"][key]
        if isinstance(want, float) and key not in DISCRETE:
            assert math.isfinite(got) == math.isfinite(want), key
            if math.isfinite(want):
                assert got == pytest.approx(want, rel=1e-2, abs=1e-4), key
        elif key not in DISCRETE:
            assert got == want, key
    for key, want in cpu["per_block"].items():
        got = dev["per_block"][key]
        assert len(got) == len(want), key
        assert len(flat(got)) == len(flat(want)), key
        assert flat(got) == pytest.approx(flat(want), rel=1e-2, abs=1e-4, nan_ok=True), key


@pytest.mark.parametrize("probe", PROBES)  # one at a time: a failure names its probe
def test_each_probe_at_init_on_the_gpu_matches_the_cpu(probe):
    cfg = ModelConfig(placement="pre", n_blocks=4, d_model=64, n_heads=4, max_seq_len=64)
    batches = text_batches(n_batches=2, batch_size=4, seq_len=64)
    cpu = probe_on(build_model(cfg, seed=0), batches, "cpu", [probe])
    dev = probe_on(build_model(cfg, seed=0), batches, DEVICE, [probe])
    assert_close(cpu, dev)
    assert cpu["summary"] or cpu["per_block"], probe


def test_probes_of_a_run_trained_on_the_gpu(tmp_path):
    cfg = run_config("model.placement=post", "train.steps=10", "train.eval_every=0",
                     "train.lr=3e-3")
    train_run(cfg, tmp_path, progress=False)
    _, on_device = load_trained_model(tmp_path / cfg.run_id(), device=DEVICE)
    assert next(on_device.parameters()).device.type == DEVICE
    _, on_cpu = load_trained_model(tmp_path / cfg.run_id())
    batches = text_batches(n_batches=2, batch_size=4, seq_len=64)
    assert_close(probe_on(on_cpu, batches, "cpu"), probe_on(on_device, batches, DEVICE))
