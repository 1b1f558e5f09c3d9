"""The environment of a process a test starts (`python -m normlab ...`, a script, a Ray head):
this repository's `normlab` first on PYTHONPATH, so the process runs the code under test, and
every entry the test process already had kept after it. An installation whose packages come
through PYTHONPATH (an HPC module stack, `pip install --target`) needs those entries: replacing
PYTHONPATH would leave the process without torch."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def subprocess_env(base: Mapping[str, str] | None = None, **extra: str) -> dict[str, str]:
    """A copy of `base` (default: this process's environment) with `extra` set and the
    repository root put first on PYTHONPATH, the entries already there kept after it in their
    order."""
    env = dict(os.environ if base is None else base) | extra
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    return env
