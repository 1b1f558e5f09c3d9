"""Sweeps: spec expansion and validation, local and Ray executors, resume after SIGKILL,
the summary table and the stability map."""

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from optional_packages import needs
from subprocess_env import subprocess_env
from typer.testing import CliRunner

from normlab.cli.sweep import sweep_app
from normlab.config import parse_overrides
from normlab.sweep import SpecError, collect, loss_curves, plan_sweep, run_sweep, stability_map
from normlab.sweep.progress import SweepProgress
from normlab.sweep.state import read_sweep_file, run_state
from normlab.sweep.summarize import RESULT_COLUMNS, to_csv, to_rich
from normlab.sweep.unfinished import record_interrupted
from normlab.train import read_summary, train_run
from normlab.train.logging import read_metrics

BASE = """
base:
  model: {n_blocks: 2, d_model: 32, n_heads: 2, max_seq_len: 32}
  data: {seq_len: 32}
  train: {steps: STEPS, batch_size: 8, eval_batches: 2, eval_every: 10, log_every: 1,
          checkpoint_every: 5, schedule: constant, grad_clip: null, device: cpu}
"""
# 2 placements x 2 learning rates x 2 warmups; lr 50 without clipping diverges within ~12 steps.
# The others end above the byte unigram entropy after 20 steps: they are `stalled`.
# Separate runs, so the Ray executor (always separate) can be compared with it bit for bit; the
# stacked engine is tested in test_batched.py (and by the SIGKILL test below, under auto).
GRID = BASE.replace("STEPS", "20") + """
engine: separate
axes:
  model.placement: [pre, post]
  train.lr: [3e-3, 50]
  train.warmup: [0, 5]
"""
RESUME = BASE.replace("STEPS", "40") + """
axes:
  model.placement: [pre, post]
  train.lr: [1e-3, 3e-3]
  train.warmup: [0, 5]
"""
ENV = subprocess_env(RAY_USAGE_STATS_ENABLED="0")
runner = CliRunner()


def write(tmp: Path, name: str, text: str) -> Path:
    path = tmp / name
    path.write_text(text)
    return path


def run_dirs(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if p.is_dir())


def alive(pid: str) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def steps_of(run_dir: Path) -> list[int]:
    return [r["step"] for r in read_metrics(run_dir / "metrics.jsonl")]


# -- spec ----------------------------------------------------------------------------------

def test_expansion_with_conditional_axes_and_ranges():
    plan = plan_sweep(BASE.replace("STEPS", "10") + """
axes:
  model.placement: [pre, post, mix]
  model.mix_switch: {values: [0.25, 0.5], when: {model.placement: mix}}
  train.lr: {log: [1e-4, 1e-2], num: 3}
  train.seed: {range: [0, 2]}
""")
    # pre and post: 3 lrs x 2 seeds each; mix: 2 ratios x 3 lrs x 2 seeds
    assert len(plan.runs) == 2 * 6 + 12 == len(set(plan.run_ids))
    for run in plan.runs:
        is_mix = run.config.model.placement == "mix"
        assert ("model.mix_switch" in run.point) == is_mix
        assert run.config.train.checkpoint_every == 5  # the base's, not the sweep default
    mix = [r.config.model.mix_switch for r in plan.runs if r.config.model.placement == "mix"]
    assert sorted(set(mix)) == [0.25, 0.5]
    assert sorted({r.config.train.lr for r in plan.runs}) == [1e-4, 1e-3, 1e-2]
    assert sorted({r.config.train.seed for r in plan.runs}) == [0, 1]
    # a condition on a base value; a list of allowed values; the sweep's checkpoint default
    plan = plan_sweep("""
base: {model: {placement: deepnorm, n_blocks: 2, d_model: 32, n_heads: 2}}
axes:
  model.deepnorm_alpha: {values: [1.0, 2.0], when: {model.placement: [deepnorm, post]}}
  model.n_blocks: {log: [2, 8], num: 3}
""")
    assert len(plan.runs) == 6
    assert sorted({r.config.model.n_blocks for r in plan.runs}) == [2, 4, 8]
    assert {r.config.train.checkpoint_every for r in plan.runs} == {50}


def test_a_condition_on_a_base_file_value_written_1e_3(tmp_path):
    """`1e-3` reads as the float 0.001 in a base config file as in the spec itself, so a `when`
    on it matches."""
    write(tmp_path, "base.yaml", "model: {n_blocks: 2, d_model: 32, n_heads: 2}\n"
                                 "train: {lr: 1e-3}\n")
    plan = plan_sweep(write(tmp_path, "spec.yaml", """
base: base.yaml
axes:
  train.seed: [0, 1]
  train.warmup: {values: [5], when: {train.lr: 0.001}}
"""))
    assert {r.config.train.warmup for r in plan.runs} == {5}
    assert parse_overrides(["train.lr=1e-3"]) == {"train": {"lr": 0.001}}


@pytest.mark.parametrize("axes, match", [
    ("model.n_head: [2]", r"axis model\.n_head: unknown config path"),
    ("train.lr: []", r"axis train\.lr: no values"),
    ("model.n_heads: [2, 3]", r"axis model\.n_heads = 3.*does not divide d_model=32"),
    ("train.lr: [1e-3, -1.0]", r"axis train\.lr = -1.*greater than 0"),
    ("train.warmup: {log: [1, 100]}", r"axis train\.warmup: log needs num"),
    ("train.seed: [0, 0]", r"axis train\.seed: value 0 is listed twice"),
    ("model.mix_switch: {values: [2], when: {model.placement: mix}}\n  model.placement: [mix]",
     r"declared after it"),
])
def test_bad_spec_fails_before_anything_runs(tmp_path, axes, match):
    spec = write(tmp_path, "bad.yaml", BASE.replace("STEPS", "10") + "axes:\n  " + axes + "\n")
    with pytest.raises(SpecError, match=match):
        plan_sweep(spec)
    r = runner.invoke(sweep_app, ["run", str(spec), "--root", str(tmp_path / "runs")])
    assert r.exit_code == 2 and "error:" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "runs").exists()


def test_every_problem_of_a_spec_is_reported_at_once(tmp_path):
    spec = write(tmp_path, "bad.yaml", """
colour: red
engine: fast
base:
  model: {n_blocks: 2, d_model: 32, n_heads: 2, max_seq_len: 32}
  data: {seq_len: 32}
axes:
  model.n_head: [2]
  train.lr: []
  train.seed: [0, 0]
  train.warmup: {log: [1, 100]}
  model.mix_switch: {values: [0.5], when: {model.placement: mix}}
  model.placement: [mix, pre]
  model.n_heads: [2, 3]
""")
    expected = ["unknown key(s) colour", "engine: 'fast' is not one of",
                "axis model.n_head: unknown config path", "axis train.lr: no values",
                "axis train.seed: value 0 is listed twice", "axis train.warmup: log needs num",
                "axis model.mix_switch: when tests model.placement, an axis declared after it",
                "axis model.n_heads = 3 (with model.placement=mix): model: n_heads: 3 does not",
                "axis model.n_heads = 3 (with model.placement=pre)"]
    with pytest.raises(SpecError) as err:
        plan_sweep(spec)
    message = str(err.value)
    assert message.startswith("sweep spec: 7 problems in the spec, and 2 of 4 runs are invalid")
    for text in expected:
        assert text in message, text
    r = runner.invoke(sweep_app, ["run", str(spec), "--root", str(tmp_path / "runs")])
    out = " ".join(r.output.split())
    assert r.exit_code == 2 and all(" ".join(t.split()) in out for t in expected), r.output
    assert not (tmp_path / "runs").exists()


def test_plan_command_lists_runs(tmp_path):
    r = runner.invoke(sweep_app, ["plan", str(write(tmp_path, "s.yaml", GRID)),
                                  "--root", str(tmp_path / "none")])
    assert r.exit_code == 0, r.output
    assert "8 runs (pending 8)" in r.output and "post-L2-d32-" in r.output
    assert "engine separate: every pending run separate" in r.output


def test_plan_command_shows_the_stacked_groups(tmp_path):
    spec = str(write(tmp_path, "s.yaml", RESUME))  # engine auto; pre and post stack apart
    r = runner.invoke(sweep_app, ["plan", spec, "--root", str(tmp_path / "none"),
                                  "--workers", "1", "--threads", "1"])
    assert r.exit_code == 0, r.output
    assert "engine auto: 8 runs in 2 stacked group(s) (4+4), 0 separate" in r.output
    r = runner.invoke(sweep_app, ["plan", spec, "--engine", "stacks"])
    assert r.exit_code == 2 and "'stacks' is not one of auto, stacked, separate" in r.output


# -- local executor, end to end --------------------------------------------------------------

@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    """The 2x2x2 grid on 2 local workers; one run is given a corrupted checkpoint first, so
    the sweep also meets a failure."""
    tmp = tmp_path_factory.mktemp("grid")
    plan = plan_sweep(write(tmp, "grid.yaml", GRID))
    root = tmp / "sweep"
    broken = next(r for r in plan.runs if r.config.train.lr == 3e-3)
    (root / broken.run_id / "checkpoint").mkdir(parents=True)
    (root / broken.run_id / "config.yaml").write_text(broken.config.to_yaml())
    (root / broken.run_id / "checkpoint" / "trainer_state.json").write_text("{not json")
    t0 = time.perf_counter()
    result = run_sweep(plan, root, workers=2, progress=False)
    return plan, result, broken.run_id, time.perf_counter() - t0


def test_local_grid_runs_everything_and_tables_it(grid, tmp_path):
    plan, result, broken, _ = grid
    root = result.root
    assert [p.name for p in run_dirs(root)] == sorted(plan.run_ids)
    assert read_sweep_file(root)["runs"][0]["run_id"] == plan.run_ids[0]
    expected = {}
    for run in plan.runs:
        if run.run_id == broken:
            expected[run.run_id] = "failed"  # failure is data; the sweep went on
        else:
            expected[run.run_id] = "stalled" if run.config.train.lr < 1 else "diverged"
    assert result.outcomes == expected and not result.ok
    assert read_summary(root / broken)["reason"] == "CheckpointError"

    table = collect(root)
    assert table.axes == ["model.placement", "train.lr", "train.warmup"]
    assert len(table.rows) == 8
    assert table.columns == ["run_id", *table.axes, *RESULT_COLUMNS]
    out = tmp_path / "summary.csv"
    to_csv(table, out)
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 8 and list(rows[0]) == table.columns
    by_id = {r["run_id"]: r for r in rows}
    for run_id, outcome in expected.items():
        row = by_id[run_id]
        assert row["outcome"] == outcome
        if outcome == "diverged":
            assert row["reason"] in ("nonfinite_loss", "nonfinite_grad", "loss_spike")
            assert 1 <= int(row["diverged_step"]) < 20 and row["val_loss"] == ""
        if outcome == "stalled":
            assert float(row["val_loss"]) < 5.5 and float(row["tokens_per_s"]) > 0
            assert row["step"] == "20" and row["diverged_step"] == ""

    # the same sweep again: finished runs are skipped, nothing is touched
    before = {p: p.stat().st_mtime_ns for p in root.glob("*/metrics.jsonl")}
    again = run_sweep(plan, root, workers=2, progress=False)
    assert again.skipped == 7  # the failed run is retried (and fails again)
    assert again.outcomes == expected
    assert {p: p.stat().st_mtime_ns for p in root.glob("*/metrics.jsonl")} == before


def test_summarize_and_map_commands(grid, tmp_path):
    root = grid[1].root
    r = runner.invoke(sweep_app, ["summarize", str(root), "--format", "csv", "--out",
                                  str(tmp_path / "s.csv")])
    assert r.exit_code == 0 and len((tmp_path / "s.csv").read_text().splitlines()) == 9
    r = runner.invoke(sweep_app, ["summarize", str(root)])
    assert r.exit_code == 0 and "diverged" in r.output and "failed" in r.output
    # json: a list of row objects keyed by the columns, numbers as numbers (a non-finite loss of
    # a diverged run as null); to DIR/summary.json by default, to stdout with --out -
    r = runner.invoke(sweep_app, ["summarize", str(root), "--format", "json", "--out", "-"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.output)
    columns = ["run_id", "model.placement", "train.lr", "train.warmup", *RESULT_COLUMNS]
    assert len(rows) == 8 and all(list(row) == columns for row in rows)
    assert {row["train.lr"] for row in rows} == {3e-3, 50}
    for row in rows:
        assert isinstance(row["step"], int) and isinstance(row["steps_planned"], int)
        if row["outcome"] == "stalled":
            assert isinstance(row["val_loss"], float) and row["diverged_step"] is None
        if row["outcome"] == "diverged":
            assert row["diverged_step"] == row["step"] and row["val_loss"] is None
    r = runner.invoke(sweep_app, ["summarize", str(root), "--format", "json"])
    assert r.exit_code == 0 and json.loads((root / "summary.json").read_text()) == rows
    (root / "summary.json").unlink()
    r = runner.invoke(sweep_app, ["summarize", str(root), "--format", "csv", "--out", "-"])
    assert r.exit_code == 0, r.output
    read = list(csv.DictReader(r.output.splitlines()))
    assert list(read[0]) == columns
    assert [row["run_id"] for row in read] == [row["run_id"] for row in rows]
    r = runner.invoke(sweep_app, ["summarize", str(root), "--format", "parquet", "--out",
                                  str(tmp_path / "s.parquet")])
    try:
        import pyarrow  # noqa: F401

        assert r.exit_code == 0 and (tmp_path / "s.parquet").exists()
    except ImportError:
        assert r.exit_code == 2 and "pyarrow" in r.output
    r = runner.invoke(sweep_app, ["map", str(root), "--out", str(tmp_path / "m.png"),
                                  "--curves"])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "m.png").exists() and (tmp_path / "m_curves.png").exists()
    r = runner.invoke(sweep_app, ["map", str(root), "--x", "train.warmupp"])
    assert r.exit_code == 2 and "train.warmupp" in r.output
    r = runner.invoke(sweep_app, ["summarize", str(tmp_path / "nowhere")])
    assert r.exit_code == 2


def test_stability_map_panels_and_cells(grid, tmp_path):
    import matplotlib.image

    _, result, broken, _ = grid
    info = stability_map(result.root, tmp_path / "map.png")
    assert info.panels == ["pre", "post"] and info.n_axes == 2
    assert info.x_values == [0, 5] and info.y_values == [3e-3, 50.0]
    image = matplotlib.image.imread(tmp_path / "map.png")
    assert image.shape[0] > 200 and image.shape[1] > 400
    cats = {k: c.category for k, c in info.cells.items()}
    assert all(cats[(p, 50.0, w)] in ("diverged", "loss spike") for p in info.panels
               for w in (0, 5))
    assert sorted(c for k, c in cats.items() if k[1] == 3e-3) == ["failed"] + ["stalled"] * 3
    curves = loss_curves(result.root, tmp_path / "curves.png")
    assert curves.n_axes == 4 and (tmp_path / "curves.png").exists()  # 2 lrs x 2 warmups
    # depth x lr or one panel: any config path; a missing one is named
    one = stability_map(result.root, tmp_path / "one.png", x="train.lr",
                        y="model.placement", panel=None)
    assert one.panels == [None] and one.n_axes == 1


def test_worker_refuses_a_config_that_resolves_to_another_run(tmp_path):
    from normlab.sweep.executors import run_one

    run = plan_sweep(GRID).runs[0]
    summary, _ = run_one(run.config.to_dict(), str(tmp_path), 1, run_id="pre-L2-d32-0123456789ab")
    assert summary["outcome"] == "failed" and summary["reason"] == "ConfigMismatch"
    assert [p.name for p in tmp_path.iterdir()] == ["pre-L2-d32-0123456789ab"]
    assert not (tmp_path / "pre-L2-d32-0123456789ab" / "metrics.jsonl").exists()


def test_a_killed_run_shows_the_step_and_losses_of_its_checkpoint(tmp_path):
    """A worker killed mid-run (Ray's forced cancel, SIGKILL) leaves the `running, step 0` it wrote
    when it started; the table, and the summary the sweep then writes, give the step a resume
    continues from and the losses logged up to it, not lines logged after the checkpoint."""
    run = plan_sweep(BASE.replace("STEPS", "20") + "axes:\n  train.seed: [0]\n").runs[0]
    root = tmp_path / "sweep"
    train_run(run.config, root, progress=False, interrupt_at=10)  # checkpoints at step 10
    run_dir = root / run.run_id
    logged = read_metrics(run_dir / "metrics.jsonl")
    with (run_dir / "metrics.jsonl").open("a") as f:  # logged after the checkpoint, then killed
        f.write(json.dumps({"step": 11, "train_loss": 99.0}) + "\n")
    (run_dir / "summary.json").write_text(json.dumps(
        {"run_id": run.run_id, "outcome": "running", "step": 0, "steps_planned": 20}))
    (run_dir / "sweep.lock").touch()  # a sweep's worker held it; nobody does now
    row = collect(root).rows[0]
    assert row["outcome"] == "interrupted" and (row["step"], row["steps_planned"]) == (10, 20)
    assert row["train_loss"] == logged[-1]["train_loss"]
    assert row["best_val_loss"] == min(r["val_loss"] for r in logged if "val_loss" in r)
    shown = " ".join(str(c) for c in to_rich(collect(root)).columns[-5]._cells)
    assert "10/20" in shown
    summary = record_interrupted(run_dir, run.run_id, "killed")
    assert read_summary(run_dir) == summary
    assert (summary["outcome"], summary["reason"], summary["step"]) == ("interrupted", "killed", 10)
    assert summary["train_loss"] == row["train_loss"]
    # a summary the run wrote itself when it stopped is kept as it is
    assert record_interrupted(run_dir, run.run_id, "other") == summary


def test_a_script_without_main_guard_fails_at_once_saying_why(tmp_path):
    """Spawned workers import the main script first; one that starts the sweep at its top level
    kills every worker while it starts. That is one clear error within seconds, not minutes of
    retries ending in `worker_died`; the same script with the guard runs."""
    write(tmp_path, "spec.yaml", BASE.replace("STEPS", "2") + "axes:\n  train.seed: [0, 1]\n")
    body = ("from normlab.sweep import plan_sweep, run_sweep\n"
            "plan = plan_sweep('spec.yaml')\n"
            "result = run_sweep(plan, 'runs', workers=2, progress=False)\n"
            "print('outcomes', sorted(result.outcomes.values()))\n")
    script = write(tmp_path, "no_guard.py", body)
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=ENV, capture_output=True,
                       text=True, timeout=150)
    assert r.returncode != 0 and "ExecutorError" in r.stderr, r.stdout + r.stderr[-2000:]
    assert 'if __name__ == "__main__":' in r.stderr and str(script) in r.stderr
    assert time.monotonic() - t0 < 120
    assert not any((tmp_path / "runs").glob("*/summary.json"))  # no run recorded as failed
    guarded = write(tmp_path, "guarded.py", "if __name__ == '__main__':\n" + "".join(
        "    " + line + "\n" for line in body.splitlines()))
    r = subprocess.run([sys.executable, str(guarded)], cwd=tmp_path, env=ENV,
                       capture_output=True, text=True, timeout=150)
    # (tiny runs end above the unigram entropy: stalled)
    assert r.returncode == 0 and "outcomes ['stalled', 'stalled']" in r.stdout, r.stderr


def test_progress_plain_lines():
    import io

    stream = io.StringIO()
    p = SweepProgress(3, workers=2, stream=stream, labels={"a": "lr=1"})
    p.start("a")
    p.finish("a", {"outcome": "diverged", "step": 7, "reason": "loss_spike"}, 2.0)
    p.close()
    text = stream.getvalue()
    assert "1/3 a lr=1: diverged at step 7 (loss_spike)" in text
    assert "ETA 2s" in text and "diverged 1" in text


# -- resume after SIGKILL ----------------------------------------------------------------------

def _start(spec: Path, root: Path, workers: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "normlab.cli.sweep", "run", str(spec),
                             "--root", str(root), "--workers", str(workers), "--quiet"], env=ENV,
                            cwd=spec.parent, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def _checkpoint_steps(root: Path) -> dict[str, int]:
    """Each run's checkpointed step. A checkpoint being replaced (its folder renamed away for a
    moment, `save_checkpoint`) can vanish between the glob and the read: the poll reads it next
    time."""
    steps = {}
    for p in root.glob("*/checkpoint/trainer_state.json"):
        try:
            steps[p.parents[1].name] = json.loads(p.read_text())["step"]
        except FileNotFoundError:
            continue
    return steps


def _wait_for(root: Path, completed: int, checkpointed: int, since: dict[str, int] | None = None,
              timeout: float = 60) -> None:
    """Until `completed` runs have trained all their steps (completed or stalled) and
    `checkpointed` unfinished runs have written a checkpoint (one later than in `since`, when
    given)."""
    since = since or {}
    deadline = time.time() + timeout
    while time.time() < deadline:
        dirs = run_dirs(root) if root.exists() else []
        outcomes = [(read_summary(p) or {}).get("outcome") for p in dirs]
        busy = [r for r, s in _checkpoint_steps(root).items() if since.get(r, 0) < s < 40]
        ended = sum(o in ("completed", "stalled") for o in outcomes)
        if ended >= completed and len(busy) >= checkpointed:
            return
        time.sleep(0.05)
    raise AssertionError(f"sweep did not get far enough in {timeout}s")


def test_sweep_killed_and_rerun_completes_every_run_once(tmp_path):
    spec = write(tmp_path, "resume.yaml", RESUME)
    plan = plan_sweep(spec)
    root = tmp_path / "sweep"

    # 1. SIGKILL the whole process group (sweep and workers) with runs part way
    proc = _start(spec, root, workers=2)
    _wait_for(root, completed=1, checkpointed=1)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    deadline = time.time() + 10  # until the killed workers are gone and their locks free
    while time.time() < deadline and "running" in [run_state(root / r)[0] for r in plan.run_ids]:
        time.sleep(0.05)
    states = [run_state(root / r)[0] for r in plan.run_ids]
    assert sum(s in ("completed", "stalled") for s in states) < 8, states
    assert "interrupted" in states, states
    left_running = [r for r in plan.run_ids if (read_summary(root / r) or {}).get(
        "outcome") == "running"]
    assert left_running  # summary says running, the lock says nobody is: interrupted

    # 2. again, now SIGKILL only the sweep process: its orphaned worker checkpoints and exits
    # (stacked groups complete several runs at once, so wait for fresh progress, not a completion)
    proc = _start(spec, root, workers=1)
    _wait_for(root, completed=0, checkpointed=1, since=_checkpoint_steps(root))
    workers = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True,
                             text=True).stdout.split()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    deadline = time.time() + 30
    while time.time() < deadline and any(alive(w) for w in workers):
        time.sleep(0.1)
    assert workers and not any(alive(w) for w in workers), "orphaned workers live on"
    states = [run_state(root / r)[0] for r in plan.run_ids]
    assert "running" not in states

    # 3. run to the end: every run trained exactly once, nothing duplicated or lost
    result = run_sweep(plan, root, workers=2, progress=False)
    assert result.ok and set(result.outcomes.values()) <= {"completed", "stalled"}
    assert sorted(p.name for p in run_dirs(root)) == sorted(plan.run_ids)
    for run_id in plan.run_ids:
        summary = read_summary(root / run_id)
        assert summary["outcome"] in ("completed", "stalled") and summary["step"] == 40
        assert steps_of(root / run_id) == list(range(1, 41)), run_id


# -- Ray ---------------------------------------------------------------------------------------

@needs("ray")
def test_ray_executor_fills_the_same_folders(grid, tmp_path):
    plan, local, broken, _ = grid
    root = tmp_path / "sweep"
    shutil.copytree(local.root, root)
    removed = [broken, next(r.run_id for r in plan.runs if r.config.train.lr == 50),
               next(r.run_id for r in plan.runs if r.config.train.lr < 1 and r.run_id != broken)]
    for run_id in removed:
        shutil.rmtree(root / run_id)
    result = run_sweep(plan, root, workers=2, executor="ray", progress=False)
    assert result.skipped == 8 - len(removed)
    assert sorted(p.name for p in run_dirs(root)) == sorted(plan.run_ids)
    assert result.outcomes[broken] == "stalled"  # trained afresh this time (20 steps)
    for run_id in removed[1:]:  # bit for bit the runs the local workers produced
        a, b = read_summary(local.root / run_id), read_summary(root / run_id)
        keys = ("outcome", "step", "reason", "val_loss", "train_loss")
        assert repr([a.get(k) for k in keys]) == repr([b.get(k) for k in keys])
