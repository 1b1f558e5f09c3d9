"""What every GPU result records beside its numbers: the device, torch and CUDA versions, the date
and the commit of the code that ran (`gpu_check.py`, `gpu_peers.py`, `gpu_check_all.py`).

The commit is read from the checkout (`git`, with `+dirty` when tracked files differ); a copy of
the tree without its `.git` (a GPU machine's) can name it in the environment variable
`NORMLAB_COMMIT`."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

NO_GPU = "no CUDA GPU on this machine, so nothing was checked"


def commit() -> str:
    """The commit the results come from, or why it is not known."""
    from normlab.train.machine import git_commit

    return (git_commit() or os.environ.get("NORMLAB_COMMIT")
            or "unknown (no git checkout; set NORMLAB_COMMIT)")


def run_meta(device: Any = None) -> dict[str, Any]:
    """The device's name (a CUDA device's, else "CPU (smoke run)"), torch and CUDA versions,
    the date (UTC) and the commit."""
    import torch

    cuda = device is not None and torch.device(device).type == "cuda"
    return {"device": torch.cuda.get_device_name(device) if cuda else "CPU (smoke run)",
            "torch": str(torch.__version__), "cuda": torch.version.cuda,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": commit()}


def meta_line(meta: dict[str, Any]) -> str:
    cuda = f"CUDA {meta['cuda']}" if meta.get("cuda") else "no CUDA"
    return (f"{meta['device']}; torch {meta['torch']}, {cuda}; {meta['date']}; "
            f"commit {meta['commit']}")
