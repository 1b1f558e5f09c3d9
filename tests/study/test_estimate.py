"""The time estimate `normlab study` starts with (`normlab.study.runner.estimate`): measured step
times x each unit's steps, and 0 s for what the study folder already holds. Nothing is trained:
the runs a study would train are finished by a fake trainer that writes their summary.json, so
the folder is the one a study leaves."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from normlab.study import runner
from normlab.study.claims import with_settings
from normlab.study.experiments import StudyFolder
from normlab.study.profiles import PROFILES
from normlab.train.machine import default_threads

# tiny's sizes (no claim at init, no fine-tuning: each test adds what it tests)
TINY = replace(PROFILES["tiny"], lrs=(1e-3, 2e-3, 4e-3), max_lr_extensions=1)


# added to post's losses: 0 matches pre's best cell with post's
POST_OFFSET = {"post": 0.0}


def _loss(family: str, lr: float, warmup: int) -> float:
    """pre is best at the grid's high edge (one extension above, 8e-3), post inside the grid."""
    best = 8e-3 if family.startswith("pre") else 2e-3
    return (2.0 + abs(lr - best) * 100 + (0.1 if warmup == 0 else 0.0)
            + (POST_OFFSET["post"] if family == "post" else 0.0))


@pytest.fixture
def fake_train(monkeypatch):
    """`StudyFolder.train` writing each run's summary.json (planted `_loss`), counting runs."""
    trained = []

    def train(self, configs):
        out = []
        for cfg in configs:
            run = self.runs_root / cfg.run_id()
            summary = {"outcome": "completed", "step": cfg.train.steps,
                       "val_loss": _loss(cfg.model.placement + ("" if cfg.model.final_norm !=
                                                                 "off" else "_nofinal"),
                                         cfg.train.lr, cfg.train.warmup),
                       "train_loss": 2.0}
            if not (run / "summary.json").exists():
                run.mkdir(parents=True)
                (run / "summary.json").write_text(json.dumps(summary))
                trained.append(cfg.run_id())
            out.append(summary)
        return out

    monkeypatch.setattr(StudyFolder, "train", train)
    return trained


@pytest.fixture
def timed(monkeypatch):
    """Step and forward times fixed (0.01 s a step, no evaluation cost); the calls recorded."""
    calls = []

    def steps(cfg, steps=3, warmup_steps=2):
        calls.append((cfg.model.n_blocks, cfg.train.batch_size))
        return 0.01

    monkeypatch.setattr(runner, "time_steps", steps)
    monkeypatch.setattr(runner, "time_forward", lambda cfg, batches=3: 0.0)
    return calls


def _study_trains(ctx: StudyFolder) -> None:
    """What C6a and C6b train: the four tuned grids, then C6a's common lrs without warmup."""
    from normlab.study.claims.c06a_warmup_common_lr import common_lrs

    tuned = {pl: ctx.tuned(pl) for pl in ("pre", "post")}
    for pl in tuned:
        ctx.tuned(pl, warmup=0)
    ctx.prefetch([(pl, common_lrs(tuned["pre"], tuned["post"]), 0) for pl in tuned])


def test_a_finished_folder_is_all_cached_and_takes_no_time(tmp_path, fake_train, timed):
    ctx = StudyFolder(tmp_path, TINY, log=lambda _m: None, claims=["C6a", "C6b"])
    before = runner.estimate(ctx)
    _study_trains(ctx)
    assert len(fake_train) > 4 * 3 * TINY.seeds  # pre's grids were extended
    timed.clear()

    after = runner.estimate(StudyFolder(tmp_path, TINY, lambda _m: None,
                                        claims=["C6a", "C6b"]))
    assert after.cached == after.units == len(fake_train)
    assert after.seconds == 0
    assert timed == []  # nothing left, nothing timed
    assert after.line(2).startswith("nothing left to train")
    assert f"{len(fake_train)} of {len(fake_train)} training runs" in after.line(2)
    # before: nothing cached, and the extensions not yet known counted as one cell a grid
    assert before.cached == 0 and before.seconds > 0
    assert before.units == 4 * 4 * TINY.seeds + 2 * TINY.seeds
    assert before.line(2).startswith("estimated ") and "0 of " in before.line(2)


def test_a_partly_finished_folder_counts_only_what_is_left(tmp_path, fake_train, timed):
    ctx = StudyFolder(tmp_path, TINY, log=lambda _m: None, claims=["C6b"])
    _study_trains(ctx)
    # pre's extension cell with warmup (lr 8e-3) lost: its seeds are what is left
    gone = [ctx.family_config("pre", 8e-3, TINY.warmup, s).run_id() for s in range(TINY.seeds)]
    assert set(gone) <= set(fake_train)
    for run_id in gone:
        (tmp_path / "runs" / run_id / "summary.json").unlink()
    est = runner.estimate(StudyFolder(tmp_path, TINY, lambda _m: None, claims=["C6b"]))
    work = est.work[0]
    assert (work.units, work.cached) == (len(fake_train), len(fake_train) - len(gone))
    assert est.seconds == pytest.approx(-(-len(gone) // TINY.workers) * TINY.steps * 0.01)
    assert est.line(TINY.workers).startswith("estimated ")
    assert f"{work.cached} of {work.units} training runs cached" in est.line(TINY.workers)


def test_the_estimate_scales_with_the_steps(tmp_path, timed):
    def seconds(steps: int) -> float:
        p = replace(TINY, steps=steps)
        return runner.estimate(StudyFolder(tmp_path / str(steps), p, lambda _m: None,
                                           claims=["C6b"])).seconds

    assert seconds(80) == pytest.approx(2 * seconds(40))
    assert seconds(40) > 0


def test_evaluations_are_counted_at_their_measured_forward_time(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "time_steps", lambda cfg, steps=3, warmup_steps=2: 0.0)
    monkeypatch.setattr(runner, "time_forward", lambda cfg, batches=3: 0.5)
    p = replace(TINY, steps=40, eval_batches=3)
    est = runner.estimate(StudyFolder(tmp_path, p, lambda _m: None, claims=["C6b"]))
    # every run evaluates every steps // 4 steps, the last at its end: 4 times 3 batches;
    # the four first grids (3 lrs, 2 seeds) share the 2 workers, then each grid's extension
    per_run = 4 * 3 * 0.5
    assert est.seconds == pytest.approx((4 * 3 * p.seeds / p.workers + 4) * per_run)


def test_steps_are_timed_with_one_workers_share_of_the_cores(tmp_path, monkeypatch):
    """The study's workers each train with cores / workers threads, so the steps behind the
    estimate are timed that way (timed with every core it came out 1.6x short on 2 cores);
    the thread count is restored after."""
    import torch

    seen = []
    monkeypatch.setattr(runner, "time_steps",
                        lambda cfg, steps=3, warmup_steps=2: seen.append(
                            torch.get_num_threads()) or 0.01)
    monkeypatch.setattr(runner, "time_forward", lambda cfg, batches=3: 0.0)
    before = torch.get_num_threads()
    p = replace(TINY, workers=2)
    torch.set_num_threads(default_threads(p.workers) + 2)
    try:
        runner.estimate(StudyFolder(tmp_path, p, lambda _m: None, claims=["C6b"]))
        assert seen == [default_threads(p.workers)]  # one shape, timed once
        assert torch.get_num_threads() == default_threads(p.workers) + 2
    finally:
        torch.set_num_threads(before)


def test_ladders_and_fine_tunings_in_the_folder_are_cached(tmp_path, timed):
    from normlab.study.claims.c07_deepnet_update import DEEPNET_CACHE, LINEAR_CACHE
    from normlab.study.claims.ladder import CACHE_VERSION

    p = with_settings(TINY, finetune_lrs=(1e-3,), finetune_lr_extensions=0)
    claims = ["C1", "C7", "C8", "C10"]
    empty = runner.estimate(StudyFolder(tmp_path / "a", p, lambda _m: None, claims=claims))
    kinds = {w.kind: w for w in empty.work}
    # Xiong's, DeepNet's saturating one, C7's linear grid and its shallower depths, Admin's
    assert kinds["ladders at init"].units == 5 and kinds["ladders at init"].cached == 0
    assert kinds["ladders at init"].seconds > 0
    assert kinds["fine-tunings"].units == 2 * 2 * p.seeds and kinds["fine-tunings"].seconds > 0

    out = tmp_path / "b"
    ctx = StudyFolder(out, p, lambda _m: None, claims=claims)
    for name in (f"ladder_xiong_{CACHE_VERSION}", f"ladder_deepnet_{DEEPNET_CACHE}",
                 f"ladder_admin_{CACHE_VERSION}", f"ladder_deepnet_linear_grid_{LINEAR_CACHE}"):
        (ctx.cache_dir / f"{name}.json").write_text("{}")
    partly = {w.kind: w for w in runner.estimate(ctx).work}["ladders at init"]
    assert partly.cached == 4 and partly.seconds > 0  # the shallower depths: still to measure
    # named by the lrs the grid chose, whichever they are
    (ctx.cache_dir / f"ladder_deepnet_linear_{LINEAR_CACHE}_source@5e-06.json").write_text("{}")
    for i in range(2 * 2 * p.seeds):
        folder = out / "runs" / f"run{i % 2}" / "finetune"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"genre-{i}.json").write_text("{}")
    full = {w.kind: w for w in runner.estimate(ctx).work}
    assert full["ladders at init"].cached == 5 and full["ladders at init"].seconds == 0
    assert full["fine-tunings"].cached == full["fine-tunings"].units
    assert full["fine-tunings"].seconds == 0


@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_fine_tunings_are_counted_only_where_c10_finds_its_matched_cells(
        tmp_path, fake_train, timed, offset, monkeypatch):
    """C10 fine-tunes the matched-loss pre and post cells, and nothing when no cells match
    (post 1 nat worse everywhere): once the grids have trained, the estimate knows which."""
    monkeypatch.setitem(POST_OFFSET, "post", offset)
    p = with_settings(TINY, finetune_lrs=(1e-3,), finetune_lr_extensions=0)
    ctx = StudyFolder(tmp_path, p, log=lambda _m: None, claims=["C10"])
    assert "fine-tunings" in {w.kind for w in runner.estimate(ctx).work}  # not known yet
    ctx.tuned("pre"), ctx.tuned("post")
    est = runner.estimate(StudyFolder(tmp_path, p, lambda _m: None, claims=["C10"]))
    kinds = {w.kind: w for w in est.work}
    assert kinds["training runs"].cached == kinds["training runs"].units
    if offset:
        assert "fine-tunings" not in kinds and est.seconds == 0
        assert est.line(2).startswith("nothing left to train")
    else:
        assert kinds["fine-tunings"].units == 2 * 2 * p.seeds
        assert kinds["fine-tunings"].seconds > 0
        assert "0 of 8 fine-tunings" in est.line(2)
