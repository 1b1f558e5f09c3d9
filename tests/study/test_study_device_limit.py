"""`normlab study --device` and `--time-limit`: where the study's runs train and what study.json
records of it, a study stopped at its time limit and continued to the result an uninterrupted
study gives, and a study folder moved to another place (or device) and continued there. On the
tiny profile, claim C11 alone (about 40 runs in a few rounds)."""

from __future__ import annotations

import json
import shutil
import time

import pytest
import torch
from typer.testing import CliRunner

from normlab.cli import app
from normlab.config import ConfigError
from normlab.study.claims import REGISTRY
from normlab.study.claims.c14_khop_depth import khop_config
from normlab.study.context import EX_TEMPFAIL, TimeLimit, TimeLimitReached
from normlab.study.devices import study_device
from normlab.study.experiments import StudyFolder
from normlab.study.profiles import PROFILES
from normlab.study.runner import _StepTimer, run_study

TINY = PROFILES["tiny"]
CLAIMS = ["C11"]


def verdicts_and_numbers(study: dict) -> str:
    """A study's claims without their wall times, as JSON text (NaN never equals itself)."""
    return json.dumps([{k: v for k, v in c.items() if k != "elapsed_s"}
                       for c in study["claims"]], sort_keys=True)


def summaries(out) -> dict[str, float]:
    return {p.parent.name: p.stat().st_mtime for p in out.glob("runs/*/summary.json")}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """C11 of the tiny study, uninterrupted, on the CPU."""
    out = tmp_path_factory.mktemp("reference")
    return out, run_study(out, "tiny", CLAIMS, log=lambda m: None)


def fake_gpu(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Fake GPU 80GB")


# -- the device --------------------------------------------------------------------------------

def test_the_device_rule(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert study_device("auto") == "cpu"
    assert study_device("cpu") == "cpu"
    with pytest.raises(ConfigError, match="--device cuda: no CUDA GPU.*--device auto"):
        study_device("cuda")
    with pytest.raises(ConfigError, match="--device: 'gpu' is not one of auto, cpu, cuda"):
        study_device("gpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert study_device("auto") == "cuda"
    assert study_device("cuda") == "cuda"
    assert study_device("cpu") == "cpu"


def test_cuda_without_a_gpu_is_a_clean_error(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    r = CliRunner().invoke(app, ["study", "--profile", "tiny", "--claims", "C11", "--device",
                                 "cuda", "--out", str(tmp_path / "s"), "--no-report"])
    assert r.exit_code == 2, r.output
    assert "--device cuda: no CUDA GPU" in r.output and "--device auto" in r.output
    assert not list(tmp_path.glob("s/runs/*"))


@pytest.mark.parametrize("profile", ["gpu", "full"])
def test_a_profile_sized_for_a_gpu_asks_before_it_runs_on_a_cpu(tmp_path, monkeypatch, profile):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    r = CliRunner().invoke(app, ["study", "--profile", profile, "--out", str(tmp_path / "s"),
                                 "--no-report"])
    assert r.exit_code == 2, r.output
    text = " ".join(r.output.split())
    assert f"--profile {profile} is sized for a GPU" in text and "no CUDA GPU" in text
    assert "give --device cpu to run it on the CPU anyway" in text
    assert ("estimated at 17 minutes" in text) == (profile == "gpu")
    assert not (tmp_path / "s").exists()  # nothing written
    # asked for explicitly, it runs there (stopped here before it trains anything)
    import normlab.study.runner as runner

    monkeypatch.setattr(runner, "PartFolder", lambda *a, **kw: (_ for _ in ()).throw(
        RuntimeError("would run")))
    with pytest.raises(RuntimeError, match="would run"):
        run_study(tmp_path / "s", profile, device="cpu", log=lambda m: None)


def test_the_gpu_profile_decides_the_scale_limited_claims_at_its_design():
    """The gpu profile's sizes are docs/study.md's design ("The gpu profile"): 8 seeds, 6-block
    models near convergence at Xiong's 4% warmup, C11 at the 24-block depth, the deep models
    probed (C2, C3, C13), C10 along trajectories with the frozen probe, k-hop to 8 hops at
    depths 2-6, one worker (one GPU)."""
    p = PROFILES["gpu"]
    assert p.sized_for == "gpu" and PROFILES["quick"].sized_for == "cpu"
    assert p.seeds == 8 and p.steps >= 2000 and p.warmup_frac == 0.04
    c9, c10, c11, c14 = (REGISTRY[c].settings(p) for c in ("C9", "C10", "C11", "C14"))
    assert c9.same_inits == ("xavier",)  # B2T's own pairing (fairseq: Xavier for both)
    assert p.deep_blocks == c11.c11_blocks == 24 and p.probe_deep
    assert c10.c10_pairs == "trajectories" and c10.finetune_probe and c10.finetune_steps >= 1000
    assert min(c10.finetune_lrs) <= 3e-5
    assert c14.khop_max_hops == 8 and c14.khop_depths == (2, 3, 4, 6) and p.workers == 1
    assert not p.theory  # the claims at init are decided on a CPU (standard)


def test_every_run_of_the_study_takes_its_device(tmp_path):
    on_gpu = StudyFolder(tmp_path, TINY, lambda m: None, device="cuda")
    on_cpu = StudyFolder(tmp_path, TINY, lambda m: None, device="cpu")
    for ctx, device in ((on_gpu, "cuda"), (on_cpu, "cpu")):
        assert ctx.family_config("pre", 1e-3, 2, 0).train.device == device
        assert ctx.family_config("post", 1e-3, 2, 1, blocks=TINY.deep_blocks or 8,
                                 trajectory=True).train.device == device
        assert khop_config(ctx, "pre", 1e-3, 0, 2).train.device == device
        assert _StepTimer(1, device).train_config(TINY).train.device == device
    # the device is part of a run's id: a study continued elsewhere reuses by `placed`
    assert on_gpu.family_config("pre", 1e-3, 2, 0).run_id() != \
        on_cpu.family_config("pre", 1e-3, 2, 0).run_id()


def test_a_run_finished_on_another_device_is_reused(tmp_path):
    on_gpu = StudyFolder(tmp_path, TINY, lambda m: None, device="cuda")
    on_cpu = StudyFolder(tmp_path, TINY, lambda m: None, device="cpu")
    cpu_run = on_cpu.family_config("pre", 1e-3, 2, 0)
    assert on_gpu.family_config("pre", 1e-3, 2, 0).train.device == "cuda"  # not finished yet
    (tmp_path / "runs" / cpu_run.run_id()).mkdir(parents=True)
    (tmp_path / "runs" / cpu_run.run_id() / "summary.json").write_text(
        json.dumps({"outcome": "completed", "val_loss": 2.0, "step": 8}))
    assert on_gpu.family_config("pre", 1e-3, 2, 0).run_id() == cpu_run.run_id()
    assert on_gpu.family_config("pre", 1e-3, 2, 1).train.device == "cuda"  # another seed


def test_the_planner_is_told_of_the_gpu(tmp_path, monkeypatch):
    import normlab.sweep.grouping as grouping

    seen = {}

    def plan_tasks(runs, engine, workers, threads=1, cuda_available=False):
        seen["cuda_available"] = cuda_available
        raise RuntimeError("planned")

    monkeypatch.setattr(grouping, "plan_tasks", plan_tasks)
    for device in ("cuda", "cpu"):
        ctx = StudyFolder(tmp_path, TINY, lambda m: None, device=device)
        with pytest.raises(RuntimeError, match="planned"):
            ctx.train([ctx.family_config("pre", lr, 2, 0) for lr in (1e-3, 2e-3)])
        assert seen.pop("cuda_available") is (device == "cuda")


def test_the_estimate_is_timed_on_the_device(monkeypatch):
    import normlab.study.runner as runner

    timed = []
    monkeypatch.setattr(runner, "time_steps", lambda cfg, steps, warmup_steps:
                        timed.append(cfg.train.device) or 0.01)
    monkeypatch.setattr(runner, "time_forward", lambda cfg: timed.append(cfg.train.device) or 0.0)
    timer = _StepTimer(2, "cuda")
    cfg = timer.train_config(TINY)
    assert timer.run_seconds(cfg) == pytest.approx(cfg.train.steps * 0.01)
    assert timed == ["cuda", "cuda"]


def test_the_step_timer_runs_on_the_configs_device():
    from normlab.study.runner import time_forward, time_steps

    cfg = _StepTimer(1, "cpu").train_config(TINY)
    assert time_steps(cfg, steps=1, warmup_steps=0) > 0
    assert time_forward(cfg, batches=1) > 0


# -- the time limit ----------------------------------------------------------------------------

class UnitsLimit(TimeLimit):
    """A time limit reached at the `units`-th training round (a clock that cannot flake)."""

    def __init__(self, units: int) -> None:
        super().__init__(3600, runs_seconds=lambda configs: 1.0)
        self.units = units

    def check(self, unit: str, seconds: float = 0.0) -> None:
        if seconds:
            self.units -= 1
            if self.units < 0:
                self.reached = f"{unit}: stopped by the test"
                raise TimeLimitReached(self.reached)


def test_a_study_stopped_at_a_unit_continues_to_the_same_result(reference, tmp_path):
    _, ref = reference
    out = tmp_path / "s"
    limit = UnitsLimit(1)
    with pytest.raises(TimeLimitReached):
        run_study(out, "tiny", CLAIMS, log=lambda m: None, time_limit=limit)
    assert limit.reached
    first = summaries(out)
    assert 0 < len(first) < len(list(reference[0].glob("runs/*/summary.json")))
    again = run_study(out, "tiny", CLAIMS, log=lambda m: None)
    assert verdicts_and_numbers(again) == verdicts_and_numbers(ref)
    assert {k: v for k, v in summaries(out).items() if k in first} == first  # kept, not redone
    on_disk = json.loads((out / "study.json").read_text())
    assert verdicts_and_numbers(on_disk) == verdicts_and_numbers(ref)


@pytest.fixture
def separate_runs(monkeypatch):
    """The study's runs each trained alone (the sweep engine `separate`), not stacked.

    A stacked step's float rounding depends on its group's size (last digits of float32), and
    where a wall-clock limit cuts decides how the runs still to train are grouped afterwards: a
    near tie between two lrs can then tune differently. Trained alone, every run resumes bit for
    bit wherever the cut falls, so the continued study must equal the uninterrupted one exactly.
    (Stacked groups resumed and regrouped: tests/train/test_batched.py.)"""
    import normlab.sweep.grouping as grouping

    plan = grouping.plan_tasks
    monkeypatch.setattr(grouping, "plan_tasks",
                        lambda runs, engine, *a, **kw: plan(runs, "separate", *a, **kw))


def test_a_unit_in_progress_at_the_limit_is_interrupted_and_resumed(separate_runs, tmp_path):
    ref = run_study(tmp_path / "reference", "tiny", CLAIMS, log=lambda m: None)
    out = tmp_path / "s"
    limit = TimeLimit(4.0)  # no estimate: every unit starts, the limit cuts one short
    with pytest.raises(KeyboardInterrupt):
        run_study(out, "tiny", CLAIMS, log=lambda m: None, time_limit=limit)
    assert limit.reached
    # the runs that finished before the cut (an interrupted run's summary says "interrupted")
    cut = {k: v for k, v in summaries(out).items()
           if json.loads((out / "runs" / k / "summary.json").read_text())["outcome"]
           != "interrupted"}
    again = run_study(out, "tiny", CLAIMS, log=lambda m: None)
    assert verdicts_and_numbers(again) == verdicts_and_numbers(ref)
    assert {k: v for k, v in summaries(out).items() if k in cut} == cut  # kept, not redone


def test_the_limit_interrupts_the_main_thread_as_ctrl_c():
    limit = TimeLimit(0.2)
    with pytest.raises(KeyboardInterrupt), limit.armed():
        time.sleep(5)
    assert limit.reached
    calm = TimeLimit(0.2)
    with calm.armed():
        pass
    time.sleep(0.4)  # disarmed: nothing fires after the block
    assert calm.reached is None


def test_check_refuses_a_unit_that_would_overrun():
    now = [0.0]
    limit = TimeLimit(60, clock=lambda: now[0])
    limit.check("a round", 59)
    with pytest.raises(TimeLimitReached, match="would take about 61 s, 60 s are left"):
        limit.check("a round", 61)
    now[0] = 61.0
    with pytest.raises(TimeLimitReached, match="no time left to start C11"):
        limit.check("C11")


def test_the_cli_stops_with_status_75_and_says_how_to_continue(tmp_path):
    out = tmp_path / "s"
    args = ["study", "--profile", "tiny", "--claims", "C11", "--out", str(out), "--device",
            "cpu", "--time-limit", "0.0005", "--no-report"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == EX_TEMPFAIL == 75, r.output
    text = " ".join(r.output.split())
    assert "time limit of 0.0005 min reached" in text
    assert (f"continue with the same command: normlab study --profile tiny --claims C11 --out "
            f"{out} --device cpu --time-limit 0.0005 --no-report") in text
    r = CliRunner().invoke(app, ["study", "--time-limit", "0", "--out", str(out)])
    assert r.exit_code == 2 and "--time-limit 0: give the minutes" in r.output


# -- moving a study folder, continuing on another device -----------------------------------------

def test_a_moved_folder_continues_on_another_device(reference, tmp_path, monkeypatch):
    ref_dir, ref = reference
    out = tmp_path / "elsewhere" / "study"
    shutil.copytree(ref_dir, tmp_path / "copy")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "copy").rename(out)  # the folder, moved
    before = summaries(out)
    fake_gpu(monkeypatch)  # continued on a machine with a GPU: nothing trains again
    again = run_study(out, "tiny", CLAIMS, log=lambda m: None, device="auto")
    assert summaries(out) == before
    assert verdicts_and_numbers(again) == verdicts_and_numbers(ref)
    study = json.loads((out / "study.json").read_text())
    assert study["device"] == "cuda" and study["device_name"] == "Fake GPU 80GB"
    assert set(study["numerics"]) >= {"float32_matmul_precision", "deterministic"}
    assert [p["device"] for p in study["parts"]] == ["cpu", "cuda"]
    assert study["runs_by_device"] == {"cpu": len(before)}
    for path in out.rglob("*"):  # nothing recorded names the folder it was written in
        if path.is_file() and path.suffix in (".json", ".yaml", ".jsonl"):
            assert str(ref_dir) not in path.read_text(), path


def test_the_report_shows_the_device(reference, tmp_path):
    from normlab.report.pages import parts_text

    _, ref = reference
    mixed = {**ref, "parts": [{**ref["parts"][0]}, {**ref["parts"][0], "device": "cuda"}]}
    assert " on cpu: " in parts_text(mixed) and " on cuda: " in parts_text(mixed)
    out = tmp_path / "s"
    shutil.copytree(reference[0], out)
    from normlab.report.html import render

    page = render(out).read_text()
    assert "Intel" in page or ref["device_name"] in page
    assert "float32_matmul_precision highest" in page


def test_advise_takes_the_device_and_refuses_cuda_without_one(monkeypatch):
    """`normlab advise --device` resolves as the study's does: cuda without a GPU exits 2 with
    the fix; auto reaches the stability check as the device it resolved to."""
    from normlab.study import advise as advise_module

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    r = CliRunner().invoke(app, ["advise", "--blocks", "2", "--width", "32", "--device", "cuda"])
    assert r.exit_code == 2 and "--device auto or --device cpu" in r.output
    seen = {}

    def fake_advise(*args, device="cpu", **kwargs):
        seen["device"] = device
        raise ConfigError("stop here")

    monkeypatch.setattr(advise_module, "advise", fake_advise)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    r = CliRunner().invoke(app, ["advise", "--blocks", "2", "--width", "32", "--no-measure"])
    assert r.exit_code == 2 and seen == {"device": "cuda"}
