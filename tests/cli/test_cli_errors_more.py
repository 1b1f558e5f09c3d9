"""Mistakes made with a trained run at hand: a run folder given as a config, a run's config.yaml
reused as a config, a damaged checkpoint probed or a damaged finished run resumed, a run's name
mistyped, and the one-file data warning as printed. Each is exit status 2 with a message that
says what is wrong and what to do, no traceback, and nothing in the run folder changed."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from normlab.cli import app
from normlab.warnings import NormlabNote
from tests.subprocess_env import subprocess_env

TINY = ["train.device=cpu", "model.n_blocks=2", "model.d_model=32", "model.n_heads=2",
        "model.max_seq_len=32", "data.seq_len=32", "train.batch_size=8", "train.steps=2",
        "train.eval_batches=1"]


def _invoke(args: list[str]):
    return CliRunner().invoke(app, [str(a) for a in args], terminal_width=200)


def _text(r) -> str:
    return " ".join(r.output.split())


def _refused(r, *needles: str) -> None:
    assert r.exit_code == 2, (r.exit_code, r.output, r.exception)
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    assert "Traceback" not in r.output
    for needle in needles:
        assert needle in _text(r), r.output


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A folder holding runs/<id>, one finished tiny run named "pre baseline"."""
    d = tmp_path_factory.mktemp("trained")
    r = _invoke(["train", *(f"--set={s}" for s in TINY), "--set=train.name=pre baseline",
                 f"--root={d / 'runs'}", "--quiet"])
    assert r.exit_code == 0, (r.output, r.exception)
    return d


@pytest.fixture
def run(trained, tmp_path, monkeypatch) -> Path:
    """A copy of the trained run, under ./runs of the test's own folder (its working folder)."""
    (src,) = (trained / "runs").iterdir()
    shutil.copytree(src, tmp_path / "runs" / src.name)
    monkeypatch.chdir(tmp_path)
    return Path("runs") / src.name


def test_a_run_folder_given_as_the_config_says_how_to_resume_it(run):
    before = _snapshot(run)
    r = _invoke(["train", run])
    _refused(r, f"{run}: is a run folder, not a config file",
             f"normlab train --resume {run}", f"{run / 'config.yaml'}")
    assert _snapshot(run) == before


def test_a_runs_config_yaml_is_accepted_as_a_config_with_a_note(run):
    """config.yaml's meta section (what the run recorded) is ignored, with a one-line note; the
    config names the same run, which is finished, so nothing is trained or written."""
    before = _snapshot(run)
    with pytest.warns(NormlabNote, match="meta section .* is ignored"):
        r = _invoke(["train", run / "config.yaml", "--quiet"])
    assert r.exit_code == 0, (r.output, r.exception)
    assert f"{run.name} (pre baseline): stalled at step 2" in _text(r) or \
        f"{run.name} (pre baseline): completed at step 2" in _text(r)
    assert _snapshot(run) == before


def test_probe_of_a_truncated_checkpoint_names_the_file_and_what_to_do(run):
    weights = run / "checkpoint" / "model.safetensors"
    size = weights.stat().st_size
    with open(weights, "r+b") as f:
        f.truncate(size - 1000)
    r = _invoke(["probe", "--checkpoint", run])
    _refused(r, f"{weights}: cannot be loaded into the run's model (the file is truncated "
                f"({size - 1000:,} bytes of {size:,})", "Restore it from a copy",
             f"normlab train {run}.damaged/config.yaml")
    assert "deserializing" not in r.output


def _cut(path: Path) -> None:
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 2)


DAMAGES = {
    "weights missing": (lambda run: (run / "checkpoint" / "model.safetensors").unlink(),
                        "model.safetensors is missing"),
    "weights truncated": (lambda run: _cut(run / "checkpoint" / "model.safetensors"),
                          "model.safetensors is truncated"),
    "checkpoint folder missing": (lambda run: shutil.rmtree(run / "checkpoint"),
                                  "model.safetensors is missing"),
    "checkpoint of another step": (
        lambda run: (run / "checkpoint" / "trainer_state.json").write_text(
            (run / "checkpoint" / "trainer_state.json").read_text().replace(
                '"step": 2', '"step": 1')),
        "is of step 1, not 2"),
}


@pytest.mark.parametrize("damage", DAMAGES)
@pytest.mark.parametrize("how", ["resume", "config"])
def test_a_finished_run_with_damaged_weights_is_not_reported_finished(run, damage, how):
    """Its summary.json says it finished, but the result is not there: exit 2, not "already
    finished, skipped" with exit 0; the folder is left as it is."""
    DAMAGES[damage][0](run)
    before = _snapshot(run)
    args = (["--resume", run] if how == "resume"
            else [*(f"--set={s}" for s in TINY), "--set=train.name=pre baseline"])
    r = _invoke(["train", *args, "--quiet"])
    _refused(r, f"{run}: damaged: its summary.json says", DAMAGES[damage][1],
             f"mv {run} {run}.damaged", f"normlab train {run}.damaged/config.yaml --root runs")
    assert "skipped" not in r.output
    assert _snapshot(run) == before


def test_a_resume_of_a_run_with_a_damaged_config_says_it_cannot_be_continued(run):
    (run / "config.yaml").write_text("model: [\n")
    r = _invoke(["train", "--resume", run, "--quiet"])
    _refused(r, f"{run / 'config.yaml'}: damaged", "cannot be continued", "restore the file")
    assert (run / "config.yaml").read_text() == "model: [\n"


def test_an_intact_finished_run_is_still_skipped(run):
    before = _snapshot(run)
    r = _invoke(["train", "--resume", run])
    assert r.exit_code == 0, (r.output, r.exception)
    assert "already stalled at step 2, skipped" in _text(r) or \
        "already completed at step 2, skipped" in _text(r)
    assert _snapshot(run) == before


@pytest.mark.parametrize("command", [["sample"], ["finetune"], ["probe", "--checkpoint"]])
def test_a_mistyped_run_name_gets_a_did_you_mean(run, command):
    r = _invoke([*command, "pre baselin"])
    _refused(r, "pre baselin: no such run folder (did you mean 'pre baseline'?)")


def test_a_mistyped_run_id_gets_a_did_you_mean(run):
    r = _invoke(["sample", run.name[:-1] + "x"])
    _refused(r, f"no such run folder (did you mean '{run.name}'?)")


def test_the_one_file_warning_prints_as_a_normlab_warning(tmp_path):
    """Not Python's `file:line: UserWarning: ...` with the source line below it."""
    (tmp_path / "notes.txt").write_text("hello world. " * 2000)
    p = subprocess.run(
        [sys.executable, "-m", "normlab", "train", *(f"--set={s}" for s in TINY),
         "--set=data.source=notes.txt", "--quiet"],
        cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "warning: only one work ('notes') in the data source" in " ".join(p.stderr.split())
    assert "UserWarning" not in p.stderr and "warnings.warn" not in p.stderr
    assert "split_works(" not in p.stderr  # no source line


@pytest.mark.parametrize("typed, meant", [("model.n_layer", "model.n_blocks"),
                                          ("model.n_embd", "model.d_model"),
                                          ("model.num_attention_heads", "model.n_heads"),
                                          ("train.max_iters", "train.steps"),
                                          ("train.learning_rate", "train.lr"),
                                          ("data.block_size", "data.seq_len")])
def test_another_librarys_name_for_a_setting_points_at_normlabs(typed, meant, tmp_path):
    """nanoGPT's and Hugging Face's names are pointed at normlab's field, where spelling distance
    alone would name another one (`n_layer` is nearer to `n_classes` than to `n_blocks`)."""
    r = _invoke(["train", "--root", tmp_path, "--set", f"{typed}=2"])
    assert r.exit_code == 2, r.output
    assert f"{typed}: unknown field (did you mean '{meant}'?)" in _text(r)
