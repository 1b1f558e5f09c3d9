"""What every benchmark writes: the machine (the CPU's model name and its flags as lscpu lists
them) and versions next to its results, recorded as JSON plus a Markdown table under
benchmarks/results/ (not with --quick)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import torch

from normlab.train.machine import cpu_flags, cpu_model, native_bf16


def new_report(args: Any, **fields: Any) -> dict[str, Any]:
    report = {"date": time.strftime("%Y-%m-%d %H:%M"), "torch": str(torch.__version__),
              "threads": torch.get_num_threads(), "cpu": cpu_model(),
              "cpu_flags": " ".join(sorted(cpu_flags())), "native_bf16": native_bf16(),
              "device": args.device, **fields}
    if args.device == "cuda":
        report["gpu"] = torch.cuda.get_device_name()
    return report


def record(args: Any, report: dict[str, Any], markdown: Callable[[dict], str], *,
           quiet: bool = False) -> None:
    """Write `report` to `args.out` (JSON) and its Markdown beside it (not with --quick);
    `quiet`: without saying so (a benchmark that records as it goes)."""
    if args.quick:
        return
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    args.out.with_suffix(".md").write_text(markdown(report))
    if not quiet:
        print(f"recorded in {args.out} and {args.out.with_suffix('.md')}")
