"""`precision: auto` on a GPU: bf16 where the GPU has it natively (compute capability 8.0 or later),
fp32 before; decided when the run starts and recorded in its config.yaml and summary."""

from __future__ import annotations

import torch
import yaml
from gpu_helpers import DEVICE, needs_gpu, run_config

from normlab.train import read_summary, train_run
from normlab.train.precision import choose_precision, resolve_precision

pytestmark = needs_gpu


def expected_auto() -> str:
    if DEVICE != "cuda":  # (the device these tests are pointed at, when not a GPU)
        cfg = run_config("train.precision=auto")
        return resolve_precision(cfg, torch.device(DEVICE)).precision
    return "bf16" if torch.cuda.get_device_capability() >= (8, 0) else "fp32"


def test_auto_picks_bf16_on_a_gpu_that_has_it():
    cfg = run_config("train.precision=auto")
    device = torch.device(DEVICE)
    choice = choose_precision("auto", device, cfg.model, 8 * 64)
    assert choice.precision == expected_auto()
    if DEVICE == "cuda":
        name = torch.cuda.get_device_name(device)
        assert choice.reason.startswith("auto: ") and name in choice.reason
    # fp32 and bf16 are taken as asked, on any device
    assert choose_precision("fp32", device, cfg.model, 512).precision == "fp32"
    assert choose_precision("bf16", device, cfg.model, 512).precision == "bf16"


def test_an_auto_run_records_its_choice(tmp_path):
    cfg = run_config("train.precision=auto", "train.steps=4", "train.eval_every=0")
    s = train_run(cfg, tmp_path, progress=False)
    assert s["outcome"] in ("stalled", "completed") and s["step"] == 4
    assert s["precision"] == expected_auto() and s["precision_reason"].startswith("auto: ")
    run_dir = tmp_path / cfg.run_id()
    meta = yaml.safe_load((run_dir / "config.yaml").read_text())["meta"]
    assert meta["precision"] == s["precision"]
    assert meta["device"].startswith(DEVICE)
    assert meta["dtype"] == ("bfloat16-autocast" if s["precision"] == "bf16" else "float32")
    assert read_summary(run_dir)["precision_reason"] == s["precision_reason"]
