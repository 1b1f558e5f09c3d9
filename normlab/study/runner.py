"""Run the study: each selected claim's experiment, its verdict, and `study.json`.

The study folder holds everything: `runs/` (ordinary run folders), `cache/` (shared probe
results), `figures/`, `study.json`. Re-running reuses all of it; an interrupted study resumes.
`study.json` is rewritten after every claim, so what finished is never lost.
"""

from __future__ import annotations

import platform
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

import normlab
from normlab.config import ConfigError
from normlab.machine import cpu_model, git_commit
from normlab.study.claims import CLAIMS
from normlab.study.experiments import StudyContext
from normlab.study.profiles import PROFILES
from normlab.study.schema import ClaimResult
from normlab.train.logging import write_json_atomic

ALL_CLAIMS = tuple(f"C{i}" for i in range(1, 14))


def parse_claims(text: str | Sequence[str] | None) -> list[str]:
    if text is None:
        return list(ALL_CLAIMS)
    items = text.split(",") if isinstance(text, str) else list(text)
    items = [s.strip().upper() for s in items if s.strip()]
    unknown = [s for s in items if s not in ALL_CLAIMS]
    if unknown or not items:
        raise ConfigError(f"--claims: unknown claim(s) {unknown or items}; choose from "
                          f"{', '.join(ALL_CLAIMS)}")
    return sorted(dict.fromkeys(items), key=ALL_CLAIMS.index)


def claim_functions() -> dict[str, Callable[[StudyContext], ClaimResult]]:
    """Every claim's experiment; C10 and C12 live with the fine-tuning and interop code."""
    funcs = dict(CLAIMS)
    from normlab.study.external import c10, c12

    funcs.update(C10=c10, C12=c12)
    return funcs


def run_study(out: Path, profile: str = "quick", claims: Sequence[str] | None = None,
              log: Callable[[str], None] = print) -> dict[str, Any]:
    if profile not in PROFILES:
        raise ConfigError(f"--profile: {profile!r} is not one of {', '.join(PROFILES)}")
    selected = parse_claims(claims)
    out.mkdir(parents=True, exist_ok=True)
    ctx = StudyContext(out, PROFILES[profile], log)
    funcs = claim_functions()
    study: dict[str, Any] = {
        "normlab": normlab.__version__, "git_commit": git_commit(),
        "torch": str(torch.__version__), "created": time.strftime("%Y-%m-%d %H:%M"),
        "profile": profile,
        "profile_settings": ctx.profile.to_dict(), "machine": _machine(), "claims": []}
    t0 = time.perf_counter()
    for cid in selected:
        t = time.perf_counter()
        log(f"{cid}: running")
        try:
            result = funcs[cid](ctx)
        except Exception as e:  # one failing experiment must not sink the others
            result = ClaimResult(
                id=cid, title=cid, statement="", source="", method="", verdict="not run",
                rule="", note=f"the experiment failed: {type(e).__name__}: {e}",
                numbers={"traceback": traceback.format_exc()})
        result.elapsed_s = time.perf_counter() - t
        log(f"{cid}: {result.verdict} ({result.elapsed_s:.0f} s)")
        study["claims"].append(result.to_dict())
        study["elapsed_s"] = time.perf_counter() - t0
        write_json_atomic(out / "study.json", study)
    return study


def _machine() -> str:
    return f"{cpu_model()}, {torch.get_num_threads()} threads, {platform.system()}"
