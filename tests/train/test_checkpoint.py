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
    is_complete,
    keep_weights,
    kept_steps,
    load_checkpoint,
    load_trained_model,
    recover_checkpoint,
    save_checkpoint,
    usable_checkpoint,
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
    with refused(f"{d}/rng.safetensors: not a usable RNG state (no torch_cpu, the CPU "
                 "generator's); delete the run folder to restart"):
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


# -- the temporary and previous folders of a save ----------------------------------------------

def folder(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir())


FILES = ["model.safetensors", "optimizer.safetensors", "rng.safetensors", "trainer_state.json"]


def test_a_save_clears_what_a_crashed_save_left_behind(tmp_path: Path):
    """A stale `.tmp` (a save cut short) and a stale `.old` (a save stopped between its renames)
    are both replaced: the new checkpoint holds only its own four files, nothing is left beside
    it, and it loads."""
    model, opt = trained()
    d = tmp_path / "ckpt"
    save_checkpoint(d, model, opt, STATE)
    for stale in ("ckpt.tmp", "ckpt.old"):
        (tmp_path / stale).mkdir()
        (tmp_path / stale / "junk.bin").write_bytes(b"x" * 10)
    save_checkpoint(d, model, opt, STATE | {"step": 7})
    assert folder(tmp_path) == ["ckpt"]
    assert folder(d) == FILES
    assert load_checkpoint(d, *trained(1), "abc")["step"] == 7


def test_the_first_save_makes_the_parent_folders(tmp_path: Path):
    model, opt = trained()
    d = tmp_path / "run" / "deeper" / "checkpoint"
    save_checkpoint(d, model, opt, STATE)
    assert folder(d) == FILES and folder(d.parent) == ["checkpoint"]


def test_the_state_is_written_as_given(tmp_path: Path):
    model, opt = trained()
    state = STATE | {"threads": 2, "run_id": "pre-L2"}
    save_checkpoint(tmp_path / "ckpt", model, opt, state)
    assert json.loads((tmp_path / "ckpt" / "trainer_state.json").read_text()) == state


def test_a_cpu_checkpoint_has_no_cuda_states(tmp_path: Path, monkeypatch):
    """Also on a GPU machine: a CPU run's checkpoint neither asks CUDA for a state (which
    would initialise it) nor stores one."""
    def no_cuda(*args, **kwargs):
        raise AssertionError("a CPU run's checkpoint touched CUDA")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", no_cuda)
    monkeypatch.setattr(torch.cuda, "get_rng_state", no_cuda)
    model, opt = trained()
    save_checkpoint(tmp_path / "ckpt", model, opt, STATE)
    from safetensors.torch import load_file

    assert list(load_file(str(tmp_path / "ckpt" / "rng.safetensors"))) == ["torch_cpu"]


# -- kept weights along a trajectory -------------------------------------------------------------

def test_kept_weights_copy_the_checkpoint_and_list_in_step_order(tmp_path: Path):
    model, opt = trained()
    d = tmp_path / "run" / "checkpoint"
    assert kept_steps(tmp_path / "run") == []  # no checkpoints/ folder yet
    for step in (2, 10, 4):
        save_checkpoint(d, model, opt, STATE | {"step": step})
        keep_weights(d, step)
    kept = tmp_path / "run" / "checkpoints"
    (kept / "step_abc.safetensors").write_bytes(b"")  # not a step: ignored
    (kept / "step_+x.safetensors").write_bytes(b"")  # nor this, which sorts before the steps
    (kept / "notes.txt").write_text("")
    assert kept_steps(tmp_path / "run") == [2, 4, 10]  # numeric, not by name
    assert kept_steps(str(tmp_path / "run")) == [2, 4, 10]
    assert sorted(p.name for p in kept.iterdir() if p.name.startswith("step_")) == [
        "step_+x.safetensors", "step_10.safetensors", "step_2.safetensors",
        "step_4.safetensors", "step_abc.safetensors"]
    assert (kept / "step_4.safetensors").read_bytes() == (d / "model.safetensors").read_bytes()


# -- finding the checkpoint after a crash ------------------------------------------------------

def saved(tmp_path: Path, name: str, step: int) -> Path:
    model, opt = trained()
    d = tmp_path / name
    save_checkpoint(d, model, opt, STATE | {"step": step})
    return d


def test_is_complete_needs_every_file_whole_and_the_state_an_object(tmp_path: Path):
    d = saved(tmp_path, "ckpt", 3)
    assert is_complete(d)
    for name in ("model.safetensors", "optimizer.safetensors", "rng.safetensors"):
        cut = saved(tmp_path, f"cut_{name}", 3)
        data = (cut / name).read_bytes()
        (cut / name).write_bytes(data[: len(data) - 4])
        assert not is_complete(cut), name
        gone = saved(tmp_path, f"gone_{name}", 3)
        (gone / name).unlink()
        assert not is_complete(gone), name
    for text in ("[1]", "{cut", ""):
        bad = saved(tmp_path, f"state_{len(text)}", 3)
        (bad / "trainer_state.json").write_text(text)
        assert not is_complete(bad), text
    nostate = saved(tmp_path, "nostate", 3)
    (nostate / "trainer_state.json").unlink()
    assert not is_complete(nostate)


def test_usable_checkpoint_prefers_the_folder_then_the_newer_tmp_then_old(tmp_path: Path):
    d = tmp_path / "ckpt"
    assert usable_checkpoint(d) is None
    saved(tmp_path, "ckpt.old", 3)
    assert usable_checkpoint(d) == tmp_path / "ckpt.old"
    saved(tmp_path, "ckpt.tmp", 6)
    assert usable_checkpoint(d) == tmp_path / "ckpt.tmp"
    (tmp_path / "ckpt.tmp" / "trainer_state.json").unlink()  # a .tmp cut short
    assert usable_checkpoint(d) == tmp_path / "ckpt.old"
    saved(tmp_path, "ckpt", 9)
    assert usable_checkpoint(d) == d


def test_recover_checkpoint_puts_back_the_newest_complete_one(tmp_path: Path):
    d = tmp_path / "ckpt"
    assert recover_checkpoint(d) is None  # nothing to recover
    saved(tmp_path, "ckpt.old", 3)
    saved(tmp_path, "ckpt.tmp", 6)
    note = recover_checkpoint(d)
    assert note == f"{d}: missing after an interrupted checkpoint write; recovered from ckpt.tmp"
    assert folder(tmp_path) == ["ckpt"]
    assert json.loads((d / "trainer_state.json").read_text())["step"] == 6
    assert recover_checkpoint(d) is None  # the folder is there: nothing done
    assert folder(tmp_path) == ["ckpt"]


def test_recover_checkpoint_keeps_an_incomplete_tmp_out(tmp_path: Path):
    d = tmp_path / "ckpt"
    saved(tmp_path, "ckpt.old", 3)
    (tmp_path / "ckpt.tmp").mkdir()  # begun, nothing written
    assert recover_checkpoint(d).endswith("recovered from ckpt.old")
    assert folder(tmp_path) == ["ckpt"]
    assert json.loads((d / "trainer_state.json").read_text())["step"] == 3


def test_a_directory_with_nothing_usable_is_left_as_it_is(tmp_path: Path):
    (tmp_path / "ckpt.tmp").mkdir()
    assert recover_checkpoint(tmp_path / "ckpt") is None
    assert folder(tmp_path) == ["ckpt.tmp"]


# -- corrupted files on load ------------------------------------------------------------------

@pytest.mark.parametrize("name", ["model.safetensors", "optimizer.safetensors",
                                  "rng.safetensors"])
@pytest.mark.parametrize("damage", ["garbage", "missing"])
def test_a_damaged_file_is_a_checkpoint_error(tmp_path: Path, name, damage):
    d = saved(tmp_path, "ckpt", 3)
    if damage == "garbage":
        (d / name).write_bytes(b"\x00\x01not a safetensors file")
    else:
        (d / name).unlink()
    with pytest.raises(CheckpointError, match="^" + re.escape(f"{d}: corrupted checkpoint (")):
        load_checkpoint(d, *trained(1), "abc")


def test_a_state_file_that_is_not_text_is_corrupted(tmp_path: Path):
    d = saved(tmp_path, "ckpt", 3)
    (d / "trainer_state.json").write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(CheckpointError, match=re.escape(str(d / "trainer_state.json"))
                       + r": corrupted \(.+\); delete the run folder to restart$"):
        load_checkpoint(d, *trained(1), "abc")


def test_a_state_without_a_hash_is_another_config(tmp_path: Path):
    model, opt = trained()
    d = tmp_path / "ckpt"
    save_checkpoint(d, model, opt, {k: v for k, v in STATE.items() if k != "config_hash"})
    with refused(f"{d}: checkpoint was written for another config (hash None != abc); resume "
                 "with the run's own config.yaml, or start a new run"):
        load_checkpoint(d, model, opt, "abc")


def test_optimizer_state_goes_only_to_its_own_parameter(tmp_path: Path):
    """Each parameter gets its own moments back, also where module names share a prefix (`a`,
    `ab`); a parameter with no state in the checkpoint gets none."""
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(2, 2)
            self.ab = nn.Linear(2, 2)

    torch.manual_seed(0)
    net = Net()
    opt = torch.optim.AdamW(net.parameters(), lr=0.1)
    net.a(torch.randn(3, 2)).sum().backward()  # only `a` gets gradients, so only it has state
    opt.step()
    save_checkpoint(tmp_path / "ckpt", net, opt, STATE)
    fresh = Net()
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=0.1)
    load_checkpoint(tmp_path / "ckpt", fresh, fresh_opt, "abc")
    for (name, p), q in zip(net.named_parameters(), fresh.parameters(), strict=True):
        if name.startswith("ab."):
            assert q not in fresh_opt.state, name
        else:
            for key in ("exp_avg", "exp_avg_sq", "step"):
                torch.testing.assert_close(fresh_opt.state[q][key], opt.state[p][key],
                                           rtol=0, atol=0)
    # a float step (AdamW's own, not a tensor) is saved as a tensor and comes back
    p0 = next(net.parameters())
    opt.state[p0]["step"] = 5.0
    save_checkpoint(tmp_path / "ckpt2", net, opt, STATE)
    load_checkpoint(tmp_path / "ckpt2", fresh, fresh_opt, "abc")
    assert float(fresh_opt.state[next(fresh.parameters())]["step"]) == 5.0


# -- a trained run's model ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def kept_run(tmp_path_factory):
    """A tiny run trained 3 steps, its weights kept at steps 1 and 2."""
    from normlab.config import load_run_config
    from normlab.train import train_run

    root = tmp_path_factory.mktemp("runs")
    cfg = load_run_config(None, [
        "model.n_blocks=1", "model.d_model=16", "model.n_heads=2", "model.max_seq_len=16",
        "data.seq_len=16", "train.batch_size=4", "train.eval_batches=1", "train.steps=3",
        "train.checkpoint_every=1", "train.keep_checkpoints=true", "train.eval_every=0",
        "train.lr=1e-2", "train.warmup=0"])
    s = train_run(cfg, root, progress=False)
    return root / s["run_id"]


def weights_of(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_load_trained_model_gives_the_final_weights_in_eval_mode(kept_run: Path):
    from safetensors.torch import load_file

    cfg, model = load_trained_model(kept_run)
    assert cfg.train.steps == 3 and cfg.model.d_model == 16
    assert not model.training
    assert next(model.parameters()).device.type == "cpu"
    saved_w = load_file(str(kept_run / "checkpoint" / "model.safetensors"))
    got = weights_of(model)
    assert saved_w and set(saved_w) <= set(got)
    for k, v in saved_w.items():
        assert torch.equal(got[k], v), k
    _, again = load_trained_model(str(kept_run), device="cpu")
    assert all(torch.equal(a, b) for a, b in zip(got.values(), weights_of(again).values(),
                                                  strict=True))


def test_load_trained_model_at_a_kept_step(kept_run: Path):
    from safetensors.torch import load_file

    assert kept_steps(kept_run) == [1, 2]
    _, at1 = load_trained_model(kept_run, step=1)
    _, final = load_trained_model(kept_run)
    step1 = load_file(str(kept_run / "checkpoints" / "step_1.safetensors"))
    got = weights_of(at1)
    for k, v in step1.items():
        assert torch.equal(got[k], v), k
    assert any(not torch.equal(got[k], weights_of(final)[k]) for k in step1)  # it trained on
    assert not at1.training
    with refused(f"{kept_run}: no weights kept at step 7 (kept: [1, 2]; latest checkpoint: "
                 "step 3); weights are kept every train.checkpoint_every=1 steps; give one of "
                 "the steps kept"):
        load_trained_model(kept_run, step=7)


def test_load_trained_model_errors_name_the_run_and_the_fix(kept_run: Path, tmp_path: Path):
    import shutil

    run = tmp_path / kept_run.name
    shutil.copytree(kept_run, run)
    shutil.rmtree(run / "checkpoints")
    with refused(f"{run}: no weights kept at step 1 (kept: none; latest checkpoint: step 3); "
                 "weights are kept every train.checkpoint_every=1 steps; give one of the steps "
                 "kept"):
        load_trained_model(run, step=1)
    # a run that kept no weights along the way is told how to keep them
    config = run / "config.yaml"
    config.write_text(config.read_text().replace("keep_checkpoints: true",
                                                 "keep_checkpoints: false"))
    with refused(f"{run}: no weights kept at step 1 (kept: none; latest checkpoint: step 3); "
                 "train with train.keep_checkpoints=true to keep the weights along the run"):
        load_trained_model(run, step=1)
    config.write_text(config.read_text().replace("keep_checkpoints: false",
                                                 "keep_checkpoints: true"))
    # a crash between the renames: the weights are read from the complete .old
    (run / "checkpoint").rename(run / "checkpoint.old")
    _, model = load_trained_model(run)
    _, ref = load_trained_model(kept_run)
    assert all(torch.equal(a, b) for a, b in zip(weights_of(model).values(),
                                                  weights_of(ref).values(), strict=True))
    shutil.rmtree(run / "checkpoint.old")
    with refused(f"{run}: no checkpoint/model.safetensors; train the run first"):
        load_trained_model(run)
    shutil.copytree(kept_run / "checkpoint", run / "checkpoint")
    weights = run / "checkpoint" / "model.safetensors"
    weights.write_bytes(b"\x00" * 16)
    with pytest.raises(CheckpointError, match="^" + re.escape(
            f"{weights}: cannot be loaded into the run's model (")):
        load_trained_model(run)


def test_the_error_lists_at_most_three_names_of_each_kind(tmp_path: Path):
    big = nn.Sequential(*(nn.Linear(2, 2) for _ in range(4)))
    d = tmp_path / "ckpt"
    save_checkpoint(d, big, torch.optim.AdamW(big.parameters()), STATE)
    small = nn.Sequential(nn.Linear(2, 2))
    with refused(f"{d}/model.safetensors does not fit the model: missing [], unexpected "
                 "['1.bias', '1.weight', '2.bias']"):
        load_checkpoint(d, small, torch.optim.AdamW(small.parameters()), "abc")


@pytest.mark.parametrize("kind", ["plain", "capturable"])
def test_optimizer_state_lands_where_torch_puts_it(kind):
    """Each slot goes where torch's own `load_state_dict` puts it: the moments on their
    parameter's device; `step` on the CPU for a plain AdamW, and as float32 on the parameter's
    device for a fused or capturable one, whose CUDA kernel refuses a CPU step (every resumed GPU
    run failed at its first step so). Checked on the `meta` device, which every build of torch
    has, so no GPU is needed; a capturable AdamW stands for the fused one, which cannot be built
    on `meta`, and takes the same branch of torch's policy."""
    from normlab.train.checkpoint import _load_optimizer_tensors

    model = nn.Linear(2, 2, device="meta")
    opt = torch.optim.AdamW(model.parameters(), capturable=kind == "capturable")
    tensors = {f"{n}.{slot}": torch.ones(p.shape) for n, p in model.named_parameters()
               for slot in ("exp_avg", "exp_avg_sq")}
    tensors |= {f"{n}.step": torch.tensor(3.0) for n, _ in model.named_parameters()}
    _load_optimizer_tensors(model, opt, tensors)
    for p in model.parameters():
        assert opt.state[p]["exp_avg"].device.type == "meta"
        assert opt.state[p]["exp_avg_sq"].device.type == "meta"
        step = opt.state[p]["step"]
        assert step.device.type == ("meta" if kind == "capturable" else "cpu")
        assert step.dtype == torch.float32
    assert opt.param_groups[0]["capturable"] is (kind == "capturable")  # its settings kept


def test_saving_tensor_states_copies_nothing_twice(tmp_path: Path):
    """Tensor slots are saved as they are (torch.tensor() of a tensor warns and copies)."""
    import warnings

    model, opt = trained()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        save_checkpoint(tmp_path / "ckpt", model, opt, STATE)


def test_load_trained_model_refuses_weights_missing_a_tensor(kept_run: Path, tmp_path: Path):
    import shutil

    from safetensors.torch import load_file, save_file

    run = tmp_path / kept_run.name
    shutil.copytree(kept_run, run)
    weights = run / "checkpoint" / "model.safetensors"
    tensors = load_file(str(weights))
    dropped = sorted(tensors)[0]
    save_file({k: v for k, v in tensors.items() if k != dropped}, str(weights))
    with pytest.raises(CheckpointError, match="^" + re.escape(
            f"{weights}: cannot be loaded into the run's model (")):
        load_trained_model(run)


def test_load_trained_model_moves_the_model_to_the_device(kept_run: Path):
    _, model = load_trained_model(kept_run, device="meta")
    assert {p.device.type for p in model.parameters()} == {"meta"}
    assert not model.training
