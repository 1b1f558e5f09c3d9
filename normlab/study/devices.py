"""Where a study trains and what it records of that: `normlab study --device` resolved
(`study_device`), the device, CUDA build and numerics flags of a study or of one invocation
(`device_record`), and the finished runs per device of a study folder (`runs_by_device`),
which a folder continued on another machine has on both."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from normlab.config import ConfigError
from normlab.study.experiments import _finished
from normlab.train.machine import cpu_model
from normlab.train.numerics import numerics_in_force

DEVICES = ("auto", "cpu", "cuda")  # `normlab study --device`


def study_device(asked: str) -> str:
    """Where a study trains, from `--device`: `cpu`, `cuda` (a CUDA GPU; ConfigError when
    there is none), or `auto`: the GPU where there is one, else the CPU."""
    if asked not in DEVICES:
        raise ConfigError(f"--device: {asked!r} is not one of {', '.join(DEVICES)}")
    available = torch.cuda.is_available()
    if asked == "cuda" and not available:
        build = "a CPU-only build" if torch.version.cuda is None else f"CUDA {torch.version.cuda}"
        raise ConfigError(f"--device cuda: no CUDA GPU is available here (torch "
                          f"{torch.__version__}, {build}); use --device auto or --device cpu")
    return "cuda" if asked == "cuda" or (asked == "auto" and available) else "cpu"


def device_record(device: str) -> dict[str, Any]:
    """What study.json records of the device a study (or a part of it) ran on: the device, its
    name, the CUDA version torch was built with (None: a CPU-only build) and the numerics flags
    in force (TF32, deterministic algorithms: `normlab.train.numerics`)."""
    return {"device": device,
            "device_name": torch.cuda.get_device_name() if device == "cuda" else cpu_model(),
            "cuda": torch.version.cuda, "numerics": numerics_in_force()}


def runs_by_device(runs_root: Path) -> dict[str, int]:
    """How many finished runs of the study folder trained on each device (`meta.device` of
    their config.yaml): a study continued on another device trains on both."""
    import yaml

    counts: dict[str, int] = {}
    for cfg in sorted(runs_root.glob("*/config.yaml")):
        if not _finished(cfg.parent):
            continue
        try:
            device = str((yaml.safe_load(cfg.read_text()) or {}).get("meta", {}).get("device"))
        except (OSError, ValueError, AttributeError, yaml.YAMLError):
            continue
        counts[device] = counts.get(device, 0) + 1
    return counts
