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
from normlab.study.claims import ALL_CLAIMS, CLAIM_GROUPS, REGISTRY, measures
from normlab.study.context import StudyContext
from normlab.study.experiments import StudyFolder
from normlab.study.profiles import PROFILES, Profile
from normlab.study.schema import ClaimResult
from normlab.sweep.executors import keep_local_workers
from normlab.train.logging import write_json_atomic
from normlab.train.machine import cpu_model, default_threads, git_commit


def parse_claims(text: str | Sequence[str] | None) -> list[str]:
    if text is None:
        return list(ALL_CLAIMS)
    items = text.split(",") if isinstance(text, str) else list(text)
    by_name = {c.upper(): (c,) for c in ALL_CLAIMS} | CLAIM_GROUPS
    wanted = [s.strip().upper() for s in items if s.strip()]
    unknown = [s for s in wanted if s not in by_name]
    if unknown or not wanted:
        raise ConfigError(f"--claims: unknown claim(s) {unknown or wanted}; choose from "
                          f"{', '.join(ALL_CLAIMS)} (C6 means C6a and C6b)")
    chosen = [c for s in wanted for c in by_name[s]]
    return sorted(dict.fromkeys(chosen), key=ALL_CLAIMS.index)


def claim_functions() -> dict[str, Callable[[StudyContext], ClaimResult]]:
    """Every claim's experiment (`normlab.study.claims.REGISTRY`)."""
    return measures()


def run_study(out: Path, profile: str = "quick", claims: Sequence[str] | None = None,
              log: Callable[[str], None] = print, *, executor: str = "local",
              address: str | None = None) -> dict[str, Any]:
    """Run the selected claims; the training runs go to local workers or, with
    `executor="ray"`, to the Ray cluster at `address` (a local instance when None)."""
    if profile not in PROFILES:
        raise ConfigError(f"--profile: {profile!r} is not one of {', '.join(PROFILES)}")
    if executor not in ("local", "ray"):
        raise ConfigError(f"--executor: {executor!r} is not one of local, ray")
    if executor == "local" and address:
        raise ConfigError(f"--address {address}: only with --executor ray (the address of a "
                          "Ray cluster); add --executor ray or drop --address")
    selected = parse_claims(claims)
    out.mkdir(parents=True, exist_ok=True)
    ctx = StudyFolder(out, PROFILES[profile], log, executor=executor, address=address,
                       claims=selected)
    if profile != "tiny":
        log(f"estimated time: {format_duration(estimate_seconds(ctx.profile))} on this machine "
            f"({ctx.profile.workers} workers; measured from a few training steps)")
    funcs = claim_functions()
    study: dict[str, Any] = {
        "normlab": normlab.__version__, "git_commit": git_commit(),
        "torch": str(torch.__version__), "created": time.strftime("%Y-%m-%d %H:%M"),
        "profile": profile,
        "profile_settings": ctx.profile.to_dict(), "machine": _machine(), "claims": []}
    parts = _earlier_parts(out / "study.json", profile)
    part = {"started": study["created"], "git_commit": study["git_commit"], "elapsed_s": 0.0,
            "claims": selected}
    study["parts"] = [*parts, part]
    t0 = time.perf_counter()
    with keep_local_workers():  # one pool of worker processes for every claim's runs
        _run_claims(ctx, selected, funcs, study, part, out, log, t0)
    return study


def _run_claims(ctx: StudyFolder, selected: Sequence[str], funcs: dict[str, Any],
                study: dict[str, Any], part: dict[str, Any], out: Path,
                log: Callable[[str], None], t0: float) -> None:
    """Each selected claim in turn, study.json written after each (a failing one recorded as
    not run)."""
    profile = study["profile"]
    for i, cid in enumerate(selected, 1):
        t = time.perf_counter()
        log(f"{cid}: running (claim {i} of {len(selected)}, "
            f"{format_duration(time.perf_counter() - t0)} so far)")
        try:
            result = (funcs[cid](ctx) if ctx.profile.theory or REGISTRY[cid].ladder is None
                      else theory_left_out(cid, profile))
        except Exception as e:  # one failing experiment must not sink the others
            result = ClaimResult(
                id=cid, title=cid, statement="", source="", method="", verdict="not run",
                rule="", note=f"the experiment failed: {type(e).__name__}: {e}",
                numbers={"traceback": traceback.format_exc()})
        result.elapsed_s = time.perf_counter() - t
        log(f"{cid}: {result.verdict} ({result.elapsed_s:.0f} s)")
        study["claims"].append(result.to_dict())
        study["elapsed_s"] = part["elapsed_s"] = time.perf_counter() - t0
        study["elapsed_total_s"] = sum(p["elapsed_s"] for p in study["parts"])
        write_json_atomic(out / "study.json", study)


def theory_left_out(cid: str, profile: str) -> ClaimResult:
    """A claim at initialization in a profile that leaves them out (`Profile.theory`)."""
    claim = REGISTRY[cid]
    return ClaimResult(
        id=cid, title=claim.title, statement=claim.statement, source=claim.source, method="",
        verdict="not run", rule="",
        note=f"The {profile} profile measures the trained claims; this claim is measured at "
             "initialization and is decided by the standard profile, whose ladders are the same "
             "size (docs/results/study_standard).")


def _earlier_parts(path: Path, profile: str) -> list[dict[str, Any]]:
    """The parts an earlier run of the same profile in this folder recorded (a resumed study
    is recorded part by part, with its total); none for a new folder or another profile."""
    import json

    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(old, dict) or old.get("profile") != profile:
        return []
    parts = old.get("parts")
    if isinstance(parts, list):
        return [p for p in parts if isinstance(p, dict) and "elapsed_s" in p]
    if isinstance(old.get("elapsed_s"), (int, float)):  # written before parts were recorded
        return [{"started": old.get("created"), "git_commit": old.get("git_commit"),
                 "elapsed_s": float(old["elapsed_s"]), "claims": None}]
    return []


def estimate_seconds(profile: Profile) -> float:
    """Rough wall time of a profile: its training runs and its fine-tuning at the step time
    measured here on one run of the profile's shape with one worker's share of the cores,
    shared by the workers; plus a minute and a half for probes and the real checkpoints.
    `estimate_runs` counts the runs."""
    from normlab.config import load_run_config

    p = profile
    cfg = load_run_config(None, [
        f"model.n_blocks={p.train_blocks}", f"model.d_model={p.train_width}",
        f"model.n_heads={p.train_heads}", f"model.max_seq_len={p.seq_len}",
        f"data.seq_len={p.seq_len}", f"train.batch_size={p.batch_size}", "train.device=cpu"])
    # each worker trains with its share of the cores, so the step is timed with that share
    threads = torch.get_num_threads()
    torch.set_num_threads(default_threads(p.workers))
    try:
        step_s = time_steps(cfg, steps=3, warmup_steps=1)
    finally:
        torch.set_num_threads(threads)
    counts = estimate_runs(p)
    return ((counts["runs"] * p.steps + counts["finetune_steps"]) * step_s
            / max(1, p.workers) + 90)


def estimate_runs(p: Profile) -> dict[str, float]:
    """The work of a profile in units of one training run of its 6-block shape and `steps`,
    per kind: each tuned grid (with warmup: pre, post, pre without final norm where it is tuned
    at 6 blocks, and C9's same-init families; without warmup: pre and post, C6b, whose cells
    C6a reuses at the common lrs) with one lr extension, a cell or so of C6a's common lrs
    outside the no-warmup grids, the deep models (C11, C12: pre and post, and pre without
    final norm where C11 decides at that depth, tuned there, the cost growing with depth and
    their own budget), the k-hop models (C14: every placement and depth, its grid with one
    extension, by tokens and width against the 6-block shape); and the fine-tuning steps of
    C10 (pretrained and from init, every lr of the grid, per placement and seed, the passage
    read in windows), and C10's pre and post trained again along trajectories where its pairs
    are taken along them."""
    cells = len(p.lrs) + 1
    nofinal_shallow = int(p.c11_trained_without and not p.c11_blocks)
    deep_families = 2 + int(p.c11_trained_without and bool(p.c11_blocks))
    deep = (deep_families * (len(p.deep_start_lrs) + 1) * p.deep_blocks / p.train_blocks
            * p.deep_train_steps / p.steps) if p.deep_blocks else 0
    khop_shape = (p.khop_batch_size * p.khop_seq_len * p.khop_width) / (
        p.batch_size * p.seq_len * p.train_width)
    khop = sum(len(p.khop_placements) * (len(p.khop_lrs) + 1) * d / p.train_blocks
               for d in p.khop_depths) * p.khop_steps / p.steps * khop_shape
    kinds = {"tuned with warmup": (2 + nofinal_shallow + len(p.same_inits)) * cells,
             "tuned without warmup (C6b)": 2 * cells,
             "C6a common lrs beyond the grids": 2,
             "deep models (C11, C12)": deep,
             "C10's trajectory runs": 2 if p.c10_pairs == "trajectories" else 0}
    out = {k: p.seeds * v for k, v in kinds.items()}
    out["k-hop models (C14)"] = p.khop_seeds * khop
    # fine-tuning in units of a training step: its batch of passages, each read as windows
    windows = max(1, p.finetune_passage_bytes // p.seq_len) * p.finetune_batch_size / p.batch_size
    lrs = len(p.finetune_lrs) + min(1, p.finetune_lr_extensions)
    finetune = 2 * 2 * p.seeds * lrs * p.finetune_steps * windows
    if p.finetune_probe:  # one pass of the frozen body over every passage, per checkpoint
        finetune += 2 * 2 * p.seeds * 13_000 * windows / p.finetune_batch_size / 2
    return out | {"runs": sum(out.values()), "finetune_steps": finetune}


def time_steps(cfg: Any, steps: int = 3, warmup_steps: int = 2) -> float:
    """Seconds per steady training step (forward, backward, AdamW) of `cfg`'s model on random
    bytes, after `warmup_steps` untimed steps (first calls allocate and pick kernels)."""
    from normlab.nn import build_model

    with torch.random.fork_rng(devices=[]):  # a measurement: the caller's generator untouched
        model = build_model(cfg.model, seed=0)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        gen = torch.Generator().manual_seed(0)
        idx = torch.randint(0, cfg.model.vocab_size, (cfg.train.batch_size, cfg.data.seq_len),
                            generator=gen)
        for i in range(warmup_steps + steps):
            if i == warmup_steps:
                t0 = time.perf_counter()
            model(idx, idx).loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    return (time.perf_counter() - t0) / steps


def format_duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _machine() -> str:
    return f"{cpu_model()}, {torch.get_num_threads()} threads, {platform.system()}"
