"""Checkpoints of a small module and its optimizer, without training: a save and load restore
weights, AdamW moments and the RNG exactly; each malformed state or file is refused with a
message naming the file, the field and what to do."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from torch import nn

from normlab.train.checkpoint import (
    CheckpointError,
    check_trainer_state,
    load_checkpoint,
    save_checkpoint,
)

STATE = {"step": 3, "best_val_loss": 2.5, "spike": {"mean": None}, "config_hash": "abc"}


def trained(seed: int = 0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(5, 4)).square().sum().backward()
    opt.step()
    return model, opt


def test_round_trip_is_exact(tmp_path: Path):
    model, opt = trained(0)
    torch.manual_seed(123)
    save_checkpoint(tmp_path / "ckpt", model, opt, STATE)
    after_save = torch.rand(3)
    fresh, fresh_opt = trained(1)
    torch.manual_seed(999)
    state = load_checkpoint(tmp_path / "ckpt", fresh, fresh_opt, "abc")
    assert state == STATE
    torch.testing.assert_close(torch.rand(3), after_save, rtol=0, atol=0)  # the RNG is back
    for a, b in zip(model.parameters(), fresh.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        sa, sb = opt.state[a], fresh_opt.state[b]
        for key in ("exp_avg", "exp_avg_sq", "step"):
            torch.testing.assert_close(sa[key], sb[key], rtol=0, atol=0)
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [
        "model.safetensors", "optimizer.safetensors", "rng.safetensors", "trainer_state.json"]
    # a second save replaces the first and leaves no .tmp or .old beside it
    save_checkpoint(tmp_path / "ckpt", model, opt, STATE | {"step": 4})
    assert json.loads((tmp_path / "ckpt" / "trainer_state.json").read_text())["step"] == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def refused(message: str):
    return pytest.raises(CheckpointError, match="^" + re.escape(message) + "$")


def test_load_errors(tmp_path: Path):
    model, opt = trained()
    d = tmp_path / "ckpt"
    with refused(f"{d}: no checkpoint here (trainer_state.json missing)"):
        load_checkpoint(d, model, opt, "abc")
    save_checkpoint(d, model, opt, STATE)
    with refused(f"{d}: checkpoint was written for another config (hash abc != xyz); resume "
                 "with the run's own config.yaml, or start a new run"):
        load_checkpoint(d, model, opt, "xyz")
    other = nn.Sequential(nn.Linear(4, 3))
    with refused(f"{d}/model.safetensors does not fit the model: missing [], unexpected "
                 "['1.bias', '1.weight']"):
        load_checkpoint(d, other, torch.optim.AdamW(other.parameters()), "abc")
    bigger = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2), nn.Linear(2, 2), nn.Linear(2, 2),
                           nn.Linear(2, 2))
    with refused(f"{d}/model.safetensors does not fit the model: missing ['2.bias', "
                 "'2.weight', '3.bias'], unexpected []"):
        load_checkpoint(d, bigger, torch.optim.AdamW(bigger.parameters()), "abc")
    (d / "trainer_state.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"^" + re.escape(str(d / "trainer_state.json"))
                       + r": corrupted \(.+\); delete the run folder to restart$"):
        load_checkpoint(d, model, opt, "abc")
    (d / "trainer_state.json").write_text(json.dumps({"step": -1}))
    with pytest.raises(CheckpointError, match=re.escape(str(d / "trainer_state.json"))):
        load_checkpoint(d, model, opt, "abc")


def test_unusable_rng_state(tmp_path: Path):
    from safetensors.torch import save_file

    model, opt = trained()
    d = tmp_path / "ckpt"
    save_checkpoint(d, model, opt, STATE)
    save_file({"other": torch.zeros(2)}, str(d / "rng.safetensors"))
    with refused(f"{d}/rng.safetensors: not a usable RNG state (KeyError: 'torch_cpu'); delete "
                 "the run folder to restart"):
        load_checkpoint(d, model, opt, "abc")


@pytest.mark.parametrize("state, what", [
    ([1], "a JSON list, not an object"),
    ({"best_val_loss": 1.0, "spike": {}}, "step is None, not a step count"),
    (STATE | {"step": True}, "step is True, not a step count"),
    (STATE | {"step": 2.0}, "step is 2.0, not a step count"),
    (STATE | {"step": -1}, "step is -1, not a step count"),
    (STATE | {"best_val_loss": None}, "best_val_loss is None, not a number"),
    (STATE | {"best_val_loss": False}, "best_val_loss is False, not a number"),
    (STATE | {"best_val_loss": float("nan")}, "best_val_loss is nan, not a number"),
    ({"step": 0, "best_val_loss": 1}, "spike, the loss-spike detector's state, is missing"),
    (STATE | {"spike": [1]}, "spike is [1], not an object"),
    (STATE | {"threads": 0}, "threads is 0, not a thread count"),
    (STATE | {"threads": True}, "threads is True, not a thread count"),
    (STATE | {"threads": "2"}, "threads is '2', not a thread count"),
])
def test_malformed_state(state, what):
    with refused(f"f.json: malformed checkpoint state ({what}); delete the checkpoint folder "
                 "to restart the run from step 0"):
        check_trainer_state(state, Path("f.json"))


def test_well_formed_states():
    for state in (STATE, STATE | {"step": 0}, STATE | {"best_val_loss": float("inf")},
                  STATE | {"best_val_loss": 3}, STATE | {"threads": 1}, STATE | {"threads": None}):
        check_trainer_state(state, Path("f.json"))
