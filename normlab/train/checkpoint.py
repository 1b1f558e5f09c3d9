"""Checkpoints as safetensors plus JSON: loading one never executes code.

    checkpoint/model.safetensors      model weights (tied weights stored once)
    checkpoint/optimizer.safetensors  AdamW moments and step counts, keyed `{param}.{slot}`
    checkpoint/rng.safetensors        torch RNG states as uint8 tensors: the CPU generator's, and
                                      a CUDA run's training device's (`torch_cuda`, whatever its
                                      index: a run resumed where another GPU is cuda:0 finds it)
    checkpoint/trainer_state.json     step, spike-detector state, best val loss, config hash

The folder is written as `checkpoint.tmp` (trainer_state.json last), then `checkpoint` becomes
`checkpoint.old`, `checkpoint.tmp` becomes `checkpoint`, and `checkpoint.old` is removed. A crash
while writing leaves the previous checkpoint intact; a crash between the two renames leaves no
`checkpoint/`, and `recover_checkpoint` puts back the newest complete one (see docs/reliability.md).
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, load_model, save_file, save_model
from torch import nn

from normlab.train.numerics import numerics_problem
from normlab.train.rundir import read_run_config

CHECKPOINT_FILES = ("model.safetensors", "optimizer.safetensors", "rng.safetensors")


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, corrupted, or belongs to another config."""


def save_checkpoint(directory: Path, model: nn.Module, optimizer: torch.optim.Optimizer,
                    state: dict[str, Any]) -> None:
    tmp = directory.with_name(directory.name + ".tmp")
    old = directory.with_name(directory.name + ".old")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_model(model, str(tmp / "model.safetensors"))
    save_file(_optimizer_tensors(model, optimizer), str(tmp / "optimizer.safetensors"))
    save_file(rng_states(model_device(model)), str(tmp / "rng.safetensors"))
    (tmp / "trainer_state.json").write_text(json.dumps(state, indent=1))
    if directory.exists():
        shutil.rmtree(old, ignore_errors=True)
        directory.rename(old)
    tmp.rename(directory)
    shutil.rmtree(old, ignore_errors=True)


def copy_checkpoint(source: Path, directory: Path, state: dict[str, Any]) -> None:
    """`source` (a complete checkpoint folder) copied as `directory`, its trainer_state.json
    updated with `state` (an extension's: its own config hash): written as `save_checkpoint`
    writes, `.tmp` first, so a crash leaves no half copy where a checkpoint is read."""
    tmp = directory.with_name(directory.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name in CHECKPOINT_FILES:
        shutil.copyfile(source / name, tmp / name)
    old = json.loads((source / "trainer_state.json").read_text())
    (tmp / "trainer_state.json").write_text(json.dumps(old | state, indent=1))
    tmp.rename(directory)


def model_device(model: nn.Module) -> torch.device:
    """The device a model's weights are on (the CPU for a model without any)."""
    return next((p.device for p in model.parameters()), torch.device("cpu"))


def rng_states(device: torch.device) -> dict[str, torch.Tensor]:
    """The generator states a run on `device` draws from: the CPU's (batches, init), and on a
    CUDA device that device's alone (dropout), keyed `torch_cuda` whatever its index. A CPU run
    saves no CUDA state, so it never initialises CUDA (on a GPU machine)."""
    states = {"torch_cpu": torch.get_rng_state()}
    if device.type == "cuda":
        states["torch_cuda"] = torch.cuda.get_rng_state(device)
    return states


def restore_rng_states(states: dict[str, torch.Tensor], device: torch.device, where: Path) -> None:
    """Set the generators `rng_states` saved for a run that now trains on `device`. A CUDA state
    where the run trains on the CPU, or none where it trains on CUDA, is a `CheckpointError`:
    the dropout masks would not continue. Checkpoints of earlier versions kept one state per
    visible GPU (`torch_cuda_{i}`), CPU runs' too; a CUDA run reads its device's index from
    them, a CPU run ignores them."""
    def refuse(what: str) -> CheckpointError:
        return CheckpointError(
            f"{where}: {what}, so its random numbers (dropout) would not continue. Resume it "
            "on the device it was trained on (train.device), or delete the checkpoint folder to "
            "restart the run from step 0")

    legacy = {k for k in states if k.startswith("torch_cuda_")}
    cuda = states.get("torch_cuda")
    if device.type == "cuda" and cuda is None and legacy:
        cuda = states.get(f"torch_cuda_{device.index or 0}")
        if cuda is None:
            raise refuse(f"the checkpoint holds the RNG states of CUDA devices "
                         f"{sorted(int(k[len('torch_cuda_'):]) for k in legacy)}, none for "
                         f"{device}")
    if device.type == "cuda" and cuda is None:
        raise refuse(f"the run trains on {device} but its checkpoint was written by a run on "
                     "the CPU (no CUDA RNG state)")
    # (earlier versions saved every visible GPU's state for CPU runs too: those say nothing)
    if device.type != "cuda" and cuda is not None:
        raise refuse(f"the run trains on {device.type} but its checkpoint was written by a run "
                     "on a CUDA device (it holds a CUDA RNG state)")
    if "torch_cpu" not in states:
        raise CheckpointError(f"{where}: not a usable RNG state (no torch_cpu, the CPU "
                              "generator's); delete the run folder to restart")
    torch.set_rng_state(states["torch_cpu"])
    if cuda is not None:
        torch.cuda.set_rng_state(cuda, device)


def keep_weights(directory: Path, step: int) -> None:
    """A copy of the weights just saved in `directory` (a run's `checkpoint/`) as the run's
    `checkpoints/step_N.safetensors`, so a trajectory outlives the next checkpoint."""
    kept = directory.parent / "checkpoints"
    kept.mkdir(exist_ok=True)
    tmp = kept / f"step_{step}.safetensors.tmp"
    shutil.copyfile(directory / "model.safetensors", tmp)
    tmp.rename(kept / f"step_{step}.safetensors")


def kept_steps(run_dir: Path | str) -> list[int]:
    """The steps whose weights the run kept (`keep_weights`), in order."""
    kept = Path(run_dir) / "checkpoints"
    steps = []
    for f in sorted(kept.glob("step_*.safetensors")) if kept.is_dir() else []:
        try:
            steps.append(int(f.name[len("step_"):-len(".safetensors")]))
        except ValueError:
            continue
    return sorted(steps)


def checkpoint_step(run_dir: Path | str) -> int | None:
    """The step of the run's latest checkpoint (`checkpoint/`, or the copy `usable_checkpoint`
    finds), None when it has none that says its step."""
    folder = usable_checkpoint(Path(run_dir) / "checkpoint")
    try:
        state = json.loads((folder / "trainer_state.json").read_text()) if folder else None
    except (OSError, ValueError):
        return None
    step = state.get("step") if isinstance(state, dict) else None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def available_steps(run_dir: Path | str) -> list[int]:
    """Every step whose weights the run holds: the kept ones (`kept_steps`) and its latest
    checkpoint's (`checkpoint_step`), in order."""
    latest = checkpoint_step(run_dir)
    return sorted({*kept_steps(run_dir), *([] if latest is None else [latest])})


def weights_note(run_dir: Path | str, step: int | None = None) -> str:
    """Which weights of a run a command reads, to say so: `RUN@STEP`, the checkpoint it is
    (its final one, a kept one, the latest of a run not finished) and, for a run that is not
    finished, its outcome. `step` None: the latest checkpoint."""
    from normlab.train.rundir import read_run_folder

    folder = read_run_folder(Path(run_dir))
    latest = checkpoint_step(run_dir)
    used = latest if step is None else step
    planned = folder.summary.get("steps_planned") or (
        folder.config.train.steps if folder.config else "?")
    finished = folder.outcome in ("completed", "stalled")
    which = ("kept weights" if used != latest else
             "its final checkpoint" if finished else "its latest checkpoint")
    note = f"{run_dir}@{used} (step {used} of {planned}, {which})"
    if not finished:
        note += (f"; the run is {folder.outcome} at step {folder.summary.get('step', latest)}, "
                 "not finished")
    return note


def _siblings(directory: Path) -> tuple[Path, Path]:
    return (directory.with_name(directory.name + ".tmp"),
            directory.with_name(directory.name + ".old"))


def is_complete(directory: Path) -> bool:
    """Whether a checkpoint folder was written to the end: trainer_state.json (written last) is a
    JSON object and every safetensors file's header covers the whole file."""
    try:
        state = json.loads((directory / "trainer_state.json").read_text())
        if not isinstance(state, dict):
            return False
        for name in CHECKPOINT_FILES:
            with safe_open(str(directory / name), "pt"):
                pass
    except (OSError, ValueError, SafetensorError):
        return False
    return True


def usable_checkpoint(directory: Path) -> Path | None:
    """The checkpoint to read: `directory` itself, or after a crash between the renames of
    `save_checkpoint` (no `directory`), the complete `.tmp` (newer) or else the `.old`."""
    if directory.exists():
        return directory
    for candidate in _siblings(directory):
        if candidate.is_dir() and is_complete(candidate):
            return candidate
    return None


def recover_checkpoint(directory: Path) -> str | None:
    """Put back `directory` after a crash between the renames of `save_checkpoint`; returns what
    was done (None when nothing was needed). The caller holds the run's lock."""
    if directory.exists():
        return None
    found = usable_checkpoint(directory)
    if found is None:
        return None
    found.rename(directory)
    for leftover in _siblings(directory):
        shutil.rmtree(leftover, ignore_errors=True)
    return (f"{directory}: missing after an interrupted checkpoint write; recovered from "
            f"{found.name}")


def load_checkpoint(directory: Path, model: nn.Module, optimizer: torch.optim.Optimizer,
                    expected_config_hash: str) -> dict[str, Any]:
    """Restore model, optimizer and RNG in place; return the trainer state (checked: `step` a
    non-negative int, `spike` an object, `best_val_loss` a number). Anything malformed is a
    `CheckpointError` naming the file."""
    state_file = directory / "trainer_state.json"
    if not state_file.exists():
        raise CheckpointError(f"{directory}: no checkpoint here (trainer_state.json missing)")
    try:
        state = json.loads(state_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{state_file}: corrupted ({e}); delete the run folder to restart"
                              ) from None
    check_trainer_state(state, state_file)
    if state.get("config_hash") != expected_config_hash:
        raise CheckpointError(
            f"{directory}: checkpoint was written for another config (hash "
            f"{state.get('config_hash')} != {expected_config_hash}); resume with the run's own "
            "config.yaml, or start a new run"
        )
    device = model_device(model)
    try:
        missing, unexpected = load_model(model, str(directory / "model.safetensors"), strict=False,
                                         device=str(device))
        if missing or unexpected:  # sets (safetensors 0.8): sorted, so the message is stable
            raise CheckpointError(
                f"{directory}/model.safetensors does not fit the model: missing "
                f"{sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]}")
        opt_tensors = load_file(str(directory / "optimizer.safetensors"), device=str(device))
        _load_optimizer_tensors(model, optimizer, opt_tensors)
        rng = load_file(str(directory / "rng.safetensors"))  # generator states live on the CPU
    except (SafetensorError, OSError, RuntimeError, KeyError) as e:
        if isinstance(e, CheckpointError):
            raise
        raise CheckpointError(f"{directory}: corrupted checkpoint ({e})") from None
    try:
        restore_rng_states(rng, device, directory / "rng.safetensors")
    except (RuntimeError, TypeError, ValueError) as e:
        if isinstance(e, CheckpointError):
            raise
        raise CheckpointError(f"{directory}/rng.safetensors: not a usable RNG state "
                              f"({type(e).__name__}: {e}); delete the run folder to restart"
                              ) from None
    return state


def check_trainer_state(state: Any, path: Path) -> None:
    """`CheckpointError` unless `state` has the fields a resume needs, with the right types."""
    def bad(what: str) -> CheckpointError:
        return CheckpointError(f"{path}: malformed checkpoint state ({what}); delete the "
                               "checkpoint folder to restart the run from step 0")

    if not isinstance(state, dict):
        raise bad(f"a JSON {type(state).__name__}, not an object")
    step = state.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise bad(f"step is {step!r}, not a step count")
    best = state.get("best_val_loss")
    if isinstance(best, bool) or not isinstance(best, (int, float)) or math.isnan(best):
        raise bad(f"best_val_loss is {best!r}, not a number")
    spike = state.get("spike")
    if not isinstance(spike, dict):
        raise bad("spike, the loss-spike detector's state, is missing" if spike is None
                  else f"spike is {spike!r}, not an object")
    threads = state.get("threads")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)
                                or threads < 1):
        raise bad(f"threads is {threads!r}, not a thread count")
    if "numerics" in state and (problem := numerics_problem(state["numerics"])):
        raise bad(problem)


def _param_names(model: nn.Module) -> dict[int, str]:
    return {id(p): name for name, p in model.named_parameters()}


def _optimizer_tensors(model: nn.Module, optimizer: torch.optim.Optimizer
                       ) -> dict[str, torch.Tensor]:
    names = _param_names(model)
    state = optimizer.state  # read once: `MuonWithAdamW.state` merges its two optimizers'
    out = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            for slot, value in state.get(p, {}).items():
                t = value if torch.is_tensor(value) else torch.tensor(value)
                out[f"{names[id(p)]}.{slot}"] = t.detach().contiguous().cpu()
    return out


def _load_optimizer_tensors(model: nn.Module, optimizer: torch.optim.Optimizer,
                            tensors: dict[str, torch.Tensor]) -> None:
    """Put the saved slots into `optimizer` through its own `load_state_dict`, so each lands on
    its parameter's device with the dtype torch's policy gives it (a fused or capturable AdamW's
    `step` as float32 on the parameter's device, which its CUDA kernel requires; a plain one's on
    the CPU)."""
    names = _param_names(model)
    current = optimizer.state_dict()  # its param_groups number the parameters in order
    state: dict[int, dict[str, torch.Tensor]] = {}
    index = 0
    for group in optimizer.param_groups:
        for p in group["params"]:
            prefix = names[id(p)] + "."
            slots = {k[len(prefix):]: v for k, v in tensors.items()
                     if k.startswith(prefix) and "." not in k[len(prefix):]}
            if slots:
                state[index] = slots
            index += 1
    optimizer.load_state_dict({"state": state, "param_groups": current["param_groups"]})


def load_trained_model(run_dir: Path | str, device: str | torch.device = "cpu",
                       step: int | None = None):
    """The model of a run folder with its checkpointed weights: `(run_config, model)`; with
    `step`, the weights the run holds of that step (`available_steps`: its latest checkpoint's,
    or the ones it kept with `train.keep_checkpoints`)."""
    from normlab.nn import build_model

    run_dir = Path(run_dir)
    cfg = read_run_config(run_dir)
    latest = checkpoint_step(run_dir) if step is not None else None
    if step is not None and step != latest:
        weights = run_dir / "checkpoints" / f"step_{step}.safetensors"
        if not weights.exists():
            last = "none" if latest is None else f"step {latest}"
            how = (f"weights are kept every train.checkpoint_every={cfg.train.checkpoint_every} "
                   "steps; give one of the steps kept" if cfg.train.keep_checkpoints else
                   "train with train.keep_checkpoints=true to keep the weights along the run")
            raise CheckpointError(f"{run_dir}: no weights kept at step {step} (kept: "
                                  f"{kept_steps(run_dir) or 'none'}; latest checkpoint: {last}); "
                                  + how)
    else:
        ckpt = usable_checkpoint(run_dir / "checkpoint")
        weights = (ckpt or run_dir / "checkpoint") / "model.safetensors"
    if not weights.exists():
        raise CheckpointError(f"{run_dir}: no checkpoint/model.safetensors; train the run first")
    from normlab.train.rundir import safetensors_problem

    broken = safetensors_problem(weights)
    if broken:
        moved = run_dir.with_name(run_dir.name + ".damaged")
        raise CheckpointError(
            f"{weights}: cannot be loaded into the run's model (the file is {broken}: cut "
            "short or overwritten, by a full disk or an interrupted copy, say). Restore it from "
            "a copy, "
            f"or train the run again: move the folder away (`mv {run_dir} {moved}`), then run "
            f"`normlab train {moved / 'config.yaml'} --root {run_dir.parent}`")
    model = build_model(cfg.model, seed=cfg.train.seed)
    try:
        load_model(model, str(weights), strict=True)
    except (SafetensorError, RuntimeError, OSError) as e:
        raise CheckpointError(f"{weights}: cannot be loaded into the run's model ({e})") from None
    return cfg, model.to(device).eval()
