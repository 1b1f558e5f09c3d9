"""The optional packages some tests need (pyproject's `[project.optional-dependencies]`): where one
is not installed, the test is skipped with a one-line reason that says how to install it, instead
of failing. `@needs("tokenizers")` marks a test (or a parameter); `require("gguf")` imports the
package in a test or a fixture; a module that needs one throughout starts with
`pytest.importorskip("ray", reason=reason("ray"))` (so that the skip names the module's line)."""

from __future__ import annotations

from importlib.util import find_spec
from types import ModuleType

import pytest

# module -> (the pip distribution, normlab's extra that installs it)
EXTRAS: dict[str, tuple[str, str]] = {
    "datasets": ("datasets", "data"),
    "tokenizers": ("tokenizers", "data"),
    "pyarrow": ("pyarrow", "parquet"),
    "transformers": ("transformers", "hf"),
    "gguf": ("gguf", "hf"),
    "accelerate": ("accelerate", "hf"),
    "ray": ("ray", "ray"),
    "x_transformers": ("x-transformers", "bench"),
}


def install_hint(module: str) -> str:
    dist, extra = EXTRAS[module]
    return f"pip install 'normlab[{extra}]' (or: pip install {dist})"


def reason(module: str) -> str:
    return f"needs the optional package {EXTRAS[module][0]}, not installed: {install_hint(module)}"


def installed(module: str) -> bool:
    return find_spec(module) is not None  # (finds it without importing it)


def needs(*modules: str) -> pytest.MarkDecorator:
    """A mark that skips a test, or a parameter (`pytest.param(..., marks=needs(...))`), unless
    every one of `modules` is installed."""
    missing = [m for m in modules if not installed(m)]
    return pytest.mark.skipif(bool(missing), reason=reason(missing[0]) if missing else "")


def require(*modules: str) -> ModuleType:
    """The first of `modules`, imported (each of them, to be sure they import); the test or
    fixture that calls it is skipped, saying how to install what is missing, when one of them is
    not installed."""
    __tracebackhide__ = True  # the skip is reported at the caller's line
    imported = [pytest.importorskip(m, reason=reason(m)) for m in modules]
    return imported[0]
