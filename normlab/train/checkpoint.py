"""Checkpoints as safetensors plus JSON: loading one never executes code.

    checkpoint/model.safetensors      model weights (tied weights stored once)
    checkpoint/optimizer.safetensors  AdamW moments and step counts, keyed `{param}.{slot}`
    checkpoint/rng.safetensors        torch RNG states (CPU, CUDA) as uint8 tensors
    checkpoint/trainer_state.json     step, spike-detector state, best val loss, config hash

The folder is written under a temporary name and renamed into place, so a crash while writing
leaves the previous checkpoint intact.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, load_model, save_file, save_model
from torch import nn


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
    rng = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            rng[f"torch_cuda_{i}"] = s
    save_file(rng, str(tmp / "rng.safetensors"))
    (tmp / "trainer_state.json").write_text(json.dumps(state, indent=1))
    if directory.exists():
        shutil.rmtree(old, ignore_errors=True)
        directory.rename(old)
    tmp.rename(directory)
    shutil.rmtree(old, ignore_errors=True)


def load_checkpoint(directory: Path, model: nn.Module, optimizer: torch.optim.Optimizer,
                    expected_config_hash: str) -> dict[str, Any]:
    """Restore model, optimizer and RNG in place; return the trainer state."""
    state_file = directory / "trainer_state.json"
    if not state_file.exists():
        raise CheckpointError(f"{directory}: no checkpoint here (trainer_state.json missing)")
    try:
        state = json.loads(state_file.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{state_file}: corrupted ({e}); delete the run folder to restart"
                              ) from None
    if state.get("config_hash") != expected_config_hash:
        raise CheckpointError(
            f"{directory}: checkpoint was written for another config (hash "
            f"{state.get('config_hash')} != {expected_config_hash}); resume with the run's own "
            "config.yaml, or start a new run"
        )
    try:
        missing, unexpected = load_model(model, str(directory / "model.safetensors"), strict=False)
        if missing or unexpected:
            raise CheckpointError(
                f"{directory}/model.safetensors does not fit the model: missing {missing[:3]}, "
                f"unexpected {unexpected[:3]}")
        opt_tensors = load_file(str(directory / "optimizer.safetensors"))
        _load_optimizer_tensors(model, optimizer, opt_tensors)
        rng = load_file(str(directory / "rng.safetensors"))
    except (SafetensorError, OSError, RuntimeError, KeyError) as e:
        if isinstance(e, CheckpointError):
            raise
        raise CheckpointError(f"{directory}: corrupted checkpoint ({e})") from None
    torch.set_rng_state(rng["torch_cpu"])
    cuda = [rng[k] for k in sorted(rng) if k.startswith("torch_cuda_")]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda)
    return state


def _param_names(model: nn.Module) -> dict[int, str]:
    return {id(p): name for name, p in model.named_parameters()}


def _optimizer_tensors(model: nn.Module, optimizer: torch.optim.Optimizer
                       ) -> dict[str, torch.Tensor]:
    names = _param_names(model)
    out = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            for slot, value in optimizer.state.get(p, {}).items():
                t = value if torch.is_tensor(value) else torch.tensor(value)
                out[f"{names[id(p)]}.{slot}"] = t.detach().contiguous().cpu()
    return out


def _load_optimizer_tensors(model: nn.Module, optimizer: torch.optim.Optimizer,
                            tensors: dict[str, torch.Tensor]) -> None:
    names = _param_names(model)
    for group in optimizer.param_groups:
        for p in group["params"]:
            prefix = names[id(p)] + "."
            slots = {k[len(prefix):]: v for k, v in tensors.items()
                     if k.startswith(prefix) and "." not in k[len(prefix):]}
            if slots:
                optimizer.state[p] = {
                    k: v.to(p.device) if k != "step" else v for k, v in slots.items()}


def load_trained_model(run_dir: Path | str, device: str | torch.device = "cpu"):
    """The model of a run folder with its checkpointed weights: `(run_config, model)`."""
    from normlab.nn import build_model
    from normlab.train.trainer import read_run_config

    run_dir = Path(run_dir)
    cfg = read_run_config(run_dir)
    weights = run_dir / "checkpoint" / "model.safetensors"
    if not weights.exists():
        raise CheckpointError(f"{run_dir}: no checkpoint/model.safetensors; train the run first")
    model = build_model(cfg.model, seed=cfg.train.seed)
    try:
        load_model(model, str(weights), strict=True)
    except (SafetensorError, RuntimeError, OSError) as e:
        raise CheckpointError(f"{weights}: cannot be loaded into the run's model ({e})") from None
    return cfg, model.to(device).eval()
