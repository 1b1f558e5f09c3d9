"""Errors of the Hugging Face interop layer, and the optional dependencies it needs.

Everything here is offline: models load from a local folder (or an in-memory model) with
`local_files_only=True` and `trust_remote_code=False`, so nothing touches a hub and no code that
ships with a checkpoint is ever run.
"""

from __future__ import annotations

import importlib
from importlib.util import find_spec
from types import ModuleType

HF_INSTALL = "pip install 'normlab[hf]'  (or: pip install transformers)"
GGUF_INSTALL = "pip install gguf accelerate"


class InteropError(ValueError):
    """A model or config normlab cannot map; the message names the field and what is supported."""


class MissingDependency(ImportError):
    """An optional package is not installed; the message gives the install command."""


def require(module: str, install: str, why: str) -> ModuleType:
    """Import `module` or raise `MissingDependency` saying how to install it."""
    if find_spec(module) is None:
        raise MissingDependency(f"{why} needs the Python package {module!r}; install it with "
                                f"`{install}`")
    return importlib.import_module(module)


def require_transformers(why: str = "Hugging Face interop") -> ModuleType:
    return require("transformers", HF_INSTALL, why)
