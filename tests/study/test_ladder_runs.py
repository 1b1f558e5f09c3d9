"""The ladders' measurements at init (`normlab.study.ladder_runs`) come out the same whether a
study's kept workers compute their cells or this process does, in the same order."""

from __future__ import annotations

import math
from typing import Any

import pytest

from normlab.study.experiments import StudyFolder
from normlab.study.ladders import fairseq_ladder
from normlab.study.profiles import PROFILES
from normlab.sweep.executors import keep_local_workers


def flat(value: Any, path: str = "") -> list[tuple[str, Any]]:
    """Every leaf of nested dicts and lists, with its path."""
    if isinstance(value, dict):
        return [x for k in value for x in flat(value[k], f"{path}.{k}")]
    if isinstance(value, list):
        return [x for i, v in enumerate(value) for x in flat(v, f"{path}[{i}]")]
    return [(path, value)]


def measure(folder: StudyFolder) -> tuple[dict, dict]:
    p = folder.profile
    rungs = fairseq_ladder(p.width, p.heads)[:2]
    init = folder.init_ladder("init", rungs, ["pre", "post"], p.init_depths, perturb=True)
    update = folder.update_ladder("update", [(rungs[0], 5e-4), (rungs[1], 1e-3)],
                                  p.init_depths, steps=2, warmup=1)
    return init, update


def test_ladders_on_the_kept_workers_equal_the_ladders_here(tmp_path):
    p = PROFILES["tiny"]
    here = measure(StudyFolder(tmp_path / "here", p, log=lambda _m: None))
    with keep_local_workers():
        there = measure(StudyFolder(tmp_path / "there", p, log=lambda _m: None))
    for a, b in zip(here, there, strict=True):
        fa, fb = flat(a), flat(b)
        assert [k for k, _v in fa] == [k for k, _v in fb]
        for (key, va), (_k, vb) in zip(fa, fb, strict=True):
            if isinstance(va, float) and math.isfinite(va):
                assert vb == pytest.approx(va, rel=1e-5, abs=1e-9), key
            else:
                assert va == vb, key
    init, update = here
    # every rung and placement has each depth and seed, in order; the update ladder has every
    # variant's rows and the init distances
    rows = init["source"]["pre"]
    assert [(r["n_blocks"], r["seed"]) for r in rows] == [
        (L, s) for L in p.init_depths for s in range(p.init_seeds)]
    assert all("stats" in r and "perturb_change" in r for r in rows)
    series = update["source"]["series"]
    assert [(r["n_blocks"], r["seed"]) for r in series["post, no warmup"]] == [
        (L, s) for L in p.init_depths for s in range(p.init_seeds)]
    assert [(r["n_blocks"], r["seed"]) for r in series["pre, no warmup"]] == [
        (max(p.init_depths), s) for s in range(p.init_seeds)]
    assert len(update["source"]["init_distance"]) == len(p.init_depths) * p.init_seeds
    assert [v["lr"] for v in update.values()] == [5e-4, 1e-3]


def test_c7_s_linear_regime_is_the_jvp_along_adam_s_first_step(tmp_path):
    """C7's first update per unit lr at a small lr (5e-6, through `update_ladder` as the claim
    asks for it) against the linear term computed here independently: the gradient at init,
    Adam's first step direction `g / (|g| + eps)` (bias-corrected moments: m = g, v = g^2), and
    the output's derivative along it by a central difference in float64."""
    import copy

    import torch

    from normlab.nn import build_model
    from normlab.probe import text_batches
    from normlab.probe.measures import model_loss
    from normlab.study.claims.c07_deepnet_update import LINEAR_VARIANTS
    from normlab.study.ladder_runs import rung_config

    p = PROFILES["tiny"]
    folder = StudyFolder(tmp_path, p, log=lambda _m: None)
    rung = fairseq_ladder(p.width, p.heads)[0]
    lr = 5e-6
    got = folder.update_ladder("linear", [(rung, lr)], p.init_depths, steps=1, warmup=0,
                               variants=LINEAR_VARIANTS, distance=False)["source"]
    assert got["init_distance"] == [] and set(got["series"]) == set(LINEAR_VARIANTS)
    idx, targets = text_batches("shakespeare", n_batches=1, batch_size=p.probe_batch_size,
                                seq_len=p.probe_seq_len, split="train")[0]
    idx_eval = folder.probe_batches()[0][0]
    for label in LINEAR_VARIANTS:
        placement = "post" if label.startswith("post") else "deepnorm"
        for row in got["series"][label]:
            cfg = rung_config(folder, rung, placement, row["n_blocks"])
            model = build_model(cfg, seed=row["seed"])
            model.train()
            params = [q for q in model.parameters()]
            loss = model_loss(cfg.kind, model(idx).logits, targets)
            grads = torch.autograd.grad(loss, params, allow_unused=True)
            step = [torch.zeros_like(q) if g is None else g / (g.abs() + 1e-8)
                    for q, g in zip(params, grads, strict=True)]
            wide = copy.deepcopy(model).double().eval()

            def moved(h: float, wide=wide, step=step) -> torch.Tensor:
                m = copy.deepcopy(wide)
                with torch.no_grad():
                    for q, d in zip(m.parameters(), step, strict=True):
                        q -= h * d.double()
                    return m.stream(idx_eval)

            h = 1e-6
            jvp = ((moved(h) - moved(-h)) / (2 * h)).norm(dim=-1).mean().item()
            assert row["update"][1] / lr == pytest.approx(jvp, rel=0.01), (label, row)


def test_a_study_on_a_gpu_measures_its_ladders_there_in_this_process(tmp_path, monkeypatch):
    """With `--device cuda` every model and batch of the ladders goes to the study's device
    (`normlab.probe.inputs.on_device`), in this process even with workers kept (a worker would
    not see the GPU's device here: the record below stays in this process), and the log says
    where. The device is recorded, not used: the models stay on the CPU here."""
    from normlab.probe import inputs

    asked: list[str] = []
    real = inputs.on_device

    def record(model, batches, device):
        asked.append(device)
        return real(model, batches, "cpu")

    monkeypatch.setattr(inputs, "on_device", record)
    logs: list[str] = []
    with keep_local_workers():
        init, update = measure(StudyFolder(tmp_path, PROFILES["tiny"], log=logs.append,
                                           device="cuda"))
    inits = sum(len(rows) for rung in init.values() for rows in rung.values())
    updates = sum(len(rows) for rung in update.values() for rows in rung["series"].values())
    distances = sum(len(rung["init_distance"]) for rung in update.values())
    assert asked == ["cuda"] * (inits + updates + 2 * distances)  # a distance: two models
    assert sum(" on cuda" in m for m in logs) == 2, logs
