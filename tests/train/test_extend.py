"""Extending a finished run (`normlab train --resume RUN --set train.steps=N`): a new run folder
that starts from the run's final checkpoint, whose id differs from the run's and from an N-step
run's from scratch; the lr schedule rule of `normlab.train.schedules`; what is refused. Also
the damaged finished run refused by the shared folder check (sweeps, the study), and refusals
never written into the folder (`record_failure`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file
from typer.testing import CliRunner

from normlab.cli import app
from normlab.config import load_run_config
from normlab.train import read_run_config, train_run
from normlab.train.rundir import read_metrics
from normlab.train.schedules import lr_at
from normlab.train.trainer import (
    DamagedRunError,
    RunFolderError,
    check_run_folder,
    record_failure,
)

TINY = ["model.n_blocks=1", "model.d_model=16", "model.n_heads=2", "model.max_seq_len=16",
        "data.seq_len=16", "train.batch_size=4", "train.eval_batches=1", "train.eval_every=0",
        "train.device=cpu", "train.log_every=1", "train.lr=1e-2"]


def cli(*args: object):
    return CliRunner().invoke(app, ["train", *map(str, args), "--quiet"], terminal_width=300)


def sets(*items: str) -> list[str]:
    return [a for s in [*TINY, *items] for a in ("--set", s)]


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != ".lock"}


def weights(run: Path) -> dict:
    return load_file(str(run / "checkpoint" / "model.safetensors"))


def train(root: Path, *items: str) -> Path:
    r = cli("--root", root, *sets(*items))
    assert r.exit_code == 0, r.output
    return root / r.output.split(":", 1)[0].strip().split()[0]


def extend(run: Path, steps: int) -> Path:
    r = cli("--resume", run, "--set", f"train.steps={steps}")
    assert r.exit_code == 0, r.output
    new = run.parent / r.output.split(":", 1)[0].strip().split()[0]
    assert new != run and new.is_dir()
    return new


def meta(run: Path) -> dict:
    return yaml.safe_load((run / "config.yaml").read_text())


def test_a_constant_lr_extension_equals_the_longer_run_from_scratch(tmp_path):
    root = tmp_path / "runs"
    short = train(root, "train.schedule=constant", "train.steps=3")
    before = snapshot(short)
    longer = extend(short, 6)
    scratch = train(root, "train.schedule=constant", "train.steps=6")
    assert len({short.name, longer.name, scratch.name}) == 3  # three runs, three folders
    a, b = weights(longer), weights(scratch)
    assert a.keys() == b.keys()
    assert all((a[k] == b[k]).all() for k in a), "the extension's weights differ"
    assert snapshot(short) == before  # the original folder is untouched
    config = meta(longer)
    assert config["train"]["steps"] == 6
    assert config["train"]["extends"] == {"run": short.name, "step": 3}
    assert config["meta"]["extends"]["rule"] == "continued"
    assert config["meta"]["extends"]["lr_before"] == config["meta"]["extends"]["lr_after"] == 1e-2
    # its records tell the whole trajectory: the original's up to 3, then its own
    records = read_metrics(longer / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert records[:3] == read_metrics(short / "metrics.jsonl")
    assert [r["train_loss"] for r in records] == [
        r["train_loss"] for r in read_metrics(scratch / "metrics.jsonl")]
    # asked again, the extension is already done: its result, nothing trained
    again = cli("--resume", short, "--set", "train.steps=6")
    assert again.exit_code == 0 and f"{longer.name}: " in again.output


def test_a_cosine_extension_recomputes_the_decay_for_the_new_total(tmp_path):
    root = tmp_path / "runs"
    short = train(root, "train.schedule=cosine", "train.warmup=1", "train.steps=4")
    longer = extend(short, 8)
    cfg6 = read_run_config(longer).train
    cfg4 = read_run_config(short).train
    records = {r["step"]: r["lr"] for r in read_metrics(longer / "metrics.jsonl")}
    # a record of step k holds the lr of 0-based step k - 1
    for k in range(5, 9):
        assert records[k] == pytest.approx(lr_at(k - 1, cfg6), rel=1e-12), k
    assert records[4] == pytest.approx(lr_at(3, cfg4)) == pytest.approx(1e-3)  # the old floor
    assert records[5] > 2 * records[4]  # the jump where the new schedule takes over
    stated = meta(longer)["meta"]["extends"]
    assert stated["rule"].startswith("recomputed for 8 steps")
    assert stated["lr_before"] == pytest.approx(records[4])
    assert stated["lr_after"] == pytest.approx(records[5])


def test_extending_twice_chains(tmp_path):
    root = tmp_path / "runs"
    first = train(root, "train.schedule=constant", "train.steps=2")
    second = extend(first, 4)
    third = extend(second, 5)
    assert meta(third)["train"]["extends"] == {"run": second.name, "step": 4}
    assert len({first.name, second.name, third.name}) == 3
    scratch = train(root, "train.schedule=constant", "train.steps=5")
    a, b = weights(third), weights(scratch)
    assert all((a[k] == b[k]).all() for k in a)


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    return train(tmp_path_factory.mktemp("finished") / "runs", "train.steps=3")


@pytest.fixture
def run(finished, tmp_path) -> Path:
    shutil.copytree(finished, tmp_path / "runs" / finished.name)
    return tmp_path / "runs" / finished.name


def refused(r, *needles: str) -> None:
    assert r.exit_code == 2, r.output
    said = " ".join(r.output.split())
    assert "Traceback" not in said
    for needle in needles:
        assert needle in said, said


@pytest.mark.parametrize("setting,needles", [
    ("train.lr=1e-3", ["--set train.lr: --resume continues", "only train.steps may be given",
                       "train a new run"]),
    ("model.d_model=32", ["--set model.d_model:", "train a new run"]),
    ("train.steps=3", ["finished at step 3", "give train.steps > 3"]),
    ("train.steps=2", ["give train.steps > 3"]),
    ("train.steps=many", ["give train.steps as a whole number"]),
])
def test_an_extension_changes_only_the_step_count_and_adds_steps(run, setting, needles):
    before = snapshot(run)
    r = cli("--resume", run, "--set", setting)
    refused(r, *needles)
    assert snapshot(run) == before
    assert sorted(p.name for p in run.parent.iterdir()) == [run.name]  # no new folder


def test_an_unfinished_run_is_resumed_before_it_is_extended(tmp_path):
    cfg = load_run_config(None, [*TINY, "train.steps=6", "train.checkpoint_every=1"])
    cut = train_run(cfg, tmp_path / "runs", progress=False, interrupt_at=2)
    run = tmp_path / "runs" / cut["run_id"]
    before = snapshot(run)
    r = cli("--resume", run, "--set", "train.steps=10")
    refused(r, "the run is interrupted at step 2 of 6, not finished",
            f"resume it first (`normlab train --resume {run}`)")
    assert snapshot(run) == before
    assert sorted(p.name for p in run.parent.iterdir()) == [run.name]


def test_a_diverged_run_is_not_extended(run):
    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps(summary | {"outcome": "diverged",
                                                            "reason": "nonfinite_loss"}))
    r = cli("--resume", run, "--set", "train.steps=6")
    refused(r, "diverged at step 3 (nonfinite_loss), so it cannot be extended",
            "train a new run")


def test_a_damaged_finished_run_is_not_extended(run):
    (run / "checkpoint" / "model.safetensors").unlink()
    r = cli("--resume", run, "--set", "train.steps=6")
    refused(r, f"{run}: damaged: its summary.json says", "model.safetensors is missing")


def test_a_config_that_extends_a_run_it_does_not_match_is_refused(run, tmp_path):
    """`train.extends` set by hand: the run it names must differ in train.steps alone."""
    other = load_run_config(None, [*TINY, "train.steps=6", "train.lr=3e-3",
                                   f"train.extends.run={run.name}", "train.extends.step=3"])
    with pytest.raises(RunFolderError, match="differs from that of .* in more than train.steps"):
        train_run(other, run.parent, progress=False)
    wrong_step = load_run_config(None, [*TINY, "train.steps=6",
                                        f"train.extends.run={run.name}", "train.extends.step=2"])
    with pytest.raises(RunFolderError, match="but that run ended at step 3"):
        train_run(wrong_step, run.parent, progress=False)


def test_the_shared_folder_check_refuses_a_damaged_finished_run(run):
    """What a sweep's worker and the study go through: a damaged result is refused, not
    skipped as done, and the refusal is not written into the folder."""
    from normlab.sweep.executors import run_one

    cfg = read_run_config(run)
    assert check_run_folder(cfg, run, "auto")["outcome"] in ("completed", "stalled")
    (run / "checkpoint" / "model.safetensors").unlink()
    before = snapshot(run)
    with pytest.raises(DamagedRunError, match="damaged: its summary.json says"):
        check_run_folder(cfg, run, "auto")
    summary, _ = run_one(cfg.to_dict(), str(run.parent))
    assert summary["outcome"] == "failed" and summary["reason"] == "DamagedRunError"
    assert "model.safetensors is missing" in summary["message"]
    assert snapshot(run) == before


def test_record_failure_writes_a_failure_and_never_a_refusal(run):
    before = snapshot(run)
    refusal = record_failure(run, run.name, DamagedRunError("its result is gone"))
    assert refusal["reason"] == "DamagedRunError" and refusal["message"] == "its result is gone"
    assert snapshot(run) == before
    failure = record_failure(run, run.name, RuntimeError("out of memory"), tb="trace")
    written = json.loads((run / "summary.json").read_text())
    assert written == failure
    assert written["outcome"] == "failed" and written["reason"] == "RuntimeError"
    assert written["message"] == "out of memory" and written["traceback"] == "trace"
    # a reason given as a word, as the sweep says of a worker that died
    died = record_failure(run, run.name, "worker_died", "the worker died")
    assert died["reason"] == "worker_died" and died["message"] == "the worker died"
