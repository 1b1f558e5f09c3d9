"""Fault injection on run folders: two writers, damaged records, interrupted checkpoint renames,
malformed checkpoint state, bad folders among good ones, a resume on another thread count.
Each promise of docs/reliability.md is checked here."""

import json
import os
import re
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch
from subprocess_env import subprocess_env
from typer.testing import CliRunner

from normlab.cli import app
from normlab.config import load_run_config
from normlab.sweep.state import is_live
from normlab.sweep.summarize import collect
from normlab.train import CheckpointError, read_summary, train_run
from normlab.train.logging import read_metrics
from normlab.warnings import NormlabWarning

# the repairs under test warn; each test that needs to checks its warnings with train_noting
pytestmark = pytest.mark.filterwarnings("ignore::normlab.warnings.NormlabWarning")

# Only the APIs this change adds are imported inside the tests that need them, so that every
# test here can be run against the code before it and fail for its own reason.

TINY = ["model.n_blocks=2", "model.d_model=32", "model.n_heads=2", "model.max_seq_len=32",
        "data.seq_len=32", "train.batch_size=8", "train.eval_batches=2", "train.log_every=1",
        "train.eval_every=4", "train.device=cpu"]
TIMING = ("time_s", "tokens_per_s")


def table_rows(output: str) -> dict[str, str]:
    """A rich table's rows by their first cell, each with its wrapped lines joined."""
    rows: dict[str, str] = {}
    key = None
    for line in output.splitlines():
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if not cells:
            continue
        key = cells[0] or key
        rows[key] = " ".join([rows.get(key, ""), *cells[1:]])
    return rows


def tiny(*extra: str):
    return load_run_config(None, TINY + list(extra))


def records(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING}
            for r in read_metrics(run_dir / "metrics.jsonl")]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """One uninterrupted 12-step run (checkpoint every 3 steps) to compare resumed runs with."""
    root = tmp_path_factory.mktemp("ref")
    cfg = tiny("train.steps=12", "train.checkpoint_every=3")
    s = train_run(cfg, root, progress=False)
    return cfg, root / s["run_id"], s


def train_noting(cfg, root: Path, **kwargs) -> tuple[dict, list[str]]:
    """`train_run`, and the normlab warnings it gave (checked after the result, so that a test
    of a defect fails on the result, not on a missing warning)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        s = train_run(cfg, root, progress=False, **kwargs)
    return s, [str(w.message) for w in caught if issubclass(w.category, NormlabWarning)]


def interrupted(cfg, root: Path, at: int) -> Path:
    s = train_run(cfg, root, progress=False, interrupt_at=at)
    assert s["outcome"] == "interrupted" and s["step"] == at
    return root / s["run_id"]


def normlab_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "normlab", *args]


ENV = subprocess_env()


# -- 1: two writers on one run folder ----------------------------------------------------------

def test_second_writer_refused_and_a_dead_holder_never_blocks(tmp_path):
    """Two real `normlab train` processes on one folder: the second exits 2 naming the folder
    and the first's pid; after the first is SIGKILLed, its stale lock blocks nobody."""
    sets = [f"--set={a}" for a in TINY + ["train.steps=100000", "train.checkpoint_every=7"]]
    first = subprocess.Popen(normlab_cmd("train", *sets, "--quiet", "--root=runs"), cwd=tmp_path,
                             env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        cfg = tiny("train.steps=100000", "train.checkpoint_every=7")
        run_dir = tmp_path / "runs" / cfg.run_id()
        deadline = time.time() + 120
        while time.time() < deadline and len(read_metrics(run_dir / "metrics.jsonl")) < 8:
            assert first.poll() is None, first.communicate()
            time.sleep(0.2)
        second = subprocess.run(normlab_cmd("train", *sets, "--quiet", "--root=runs"),
                                cwd=tmp_path, env=ENV, capture_output=True, text=True,
                                timeout=120)
        assert second.returncode == 2, second.stderr
        assert is_live(run_dir) is True  # the lock the sweeps read is the trainer's lock
        message = " ".join(second.stderr.split())
        assert str(first.pid) in message and cfg.run_id() in message
        assert "Traceback" not in second.stderr
        assert first.poll() is None  # the first one trains on, undisturbed
    finally:
        first.kill()
        first.wait(timeout=60)
    # the holder died by SIGKILL: the kernel released its lock; the run resumes, saying it
    # cleared the lock the dead process left, and its records continue the checkpoint's without
    # a gap or a duplicate
    assert is_live(run_dir) is False
    state = json.loads((run_dir / "checkpoint" / "trainer_state.json").read_text())
    s, noted = train_noting(cfg, tmp_path / "runs", interrupt_at=state["step"] + 3)
    assert s["outcome"] == "interrupted" and s["step"] == state["step"] + 3
    assert f"{run_dir}: cleared a stale lock: it named process {first.pid}, which no longer " \
           "exists; the run proceeds" in noted
    assert [r["step"] for r in read_metrics(run_dir / "metrics.jsonl")] == list(
        range(1, s["step"] + 1))


def test_a_held_folder_refuses_the_trainer_and_the_group(tmp_path):
    """Another process holds the lock (as a sweep worker would): train_run and train_group
    refuse before writing anything."""
    from normlab.train import RunLockedError
    from normlab.train.group import train_group
    from normlab.train.rundir import hold_run

    cfg = tiny("train.steps=4")
    run_dir = tmp_path / cfg.run_id()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; "
         "from normlab.train.rundir import hold_run\n"
         f"with hold_run(Path({str(run_dir)!r})):\n print('held', flush=True); time.sleep(120)"],
        env=ENV, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunLockedError, match=f"process {holder.pid}"):
            train_run(cfg, tmp_path, progress=False)
        with pytest.raises(RunLockedError, match=str(holder.pid)):
            train_group([cfg, tiny("train.steps=4", "train.seed=1")], tmp_path)
        assert sorted(p.name for p in run_dir.iterdir()) == [".lock"]  # nothing written
    finally:
        holder.kill()
        holder.wait(timeout=30)
    with hold_run(run_dir):  # re-entrant in one process: a sweep worker holds, the trainer enters
        assert train_run(cfg, tmp_path, progress=False)["outcome"] in ("completed", "stalled")


def dead_pid() -> int:
    """The id of a process that has ended and been reaped: no process has it now (until the
    system hands it out again, which takes a full turn of pids)."""
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait(timeout=60)
    if sys.platform == "linux":
        assert not Path(f"/proc/{done.pid}").exists()
    return done.pid


def test_a_stale_lock_is_cleared_with_a_message_and_a_live_one_refuses(tmp_path):
    """A lock file naming a process that no longer exists (it was killed while it held the
    lock): the run proceeds, saying it cleared the stale lock, with that pid and the run; the
    note is kept in summary.json. A clean end leaves the file empty, so the next run says
    nothing. A lock a live process holds still refuses, naming that process."""
    pytest.importorskip("fcntl")
    cfg = tiny("train.steps=4")
    run_dir = tmp_path / cfg.run_id()
    run_dir.mkdir()
    pid = dead_pid()
    (run_dir / ".lock").write_text(f"{pid}\n")  # as a killed holder leaves it
    s, noted = train_noting(cfg, tmp_path)
    assert s["outcome"] in ("completed", "stalled")
    stale = [n for n in noted if "stale lock" in n]
    assert stale == [f"{run_dir}: cleared a stale lock: it named process {pid}, which no longer "
                     "exists; the run proceeds"]
    assert read_summary(run_dir)["repairs"] == stale
    assert (run_dir / ".lock").read_text() == ""  # let go cleanly: nothing to clear next time
    again, noted = train_noting(cfg, tmp_path)
    assert again["outcome"] == s["outcome"] and not [n for n in noted if "stale" in n]

    # the CLI says it too, on stderr, and trains
    fresh = tiny("train.steps=4", "train.seed=1")
    (tmp_path / fresh.run_id()).mkdir()
    (tmp_path / fresh.run_id() / ".lock").write_text(f"{pid}\n")
    r = subprocess.run(normlab_cmd("train", *(f"--set={a}" for a in TINY),
                                   "--set=train.steps=4", "--set=train.seed=1", "--quiet",
                                   f"--root={tmp_path}"),
                       env=ENV, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    message = " ".join(r.stderr.split())
    assert f"cleared a stale lock: it named process {pid}, which no longer exists" in message
    assert fresh.run_id() in message

    # a live holder: refused, naming it; the lock file is left as it is
    holder = subprocess.Popen(
        [sys.executable, "-c", "import time; from pathlib import Path; "
         "from normlab.train.rundir import hold_run\n"
         f"with hold_run(Path({str(run_dir)!r})):\n print('held', flush=True); time.sleep(120)"],
        env=ENV, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        from normlab.train import RunLockedError

        with pytest.raises(RunLockedError) as e:
            train_run(cfg, tmp_path, progress=False)
        assert str(e.value) == (
            f"{run_dir}: in use by process {holder.pid}, which is training this run (a `normlab "
            "train`, a sweep or a study); wait for it to finish or stop it, then run again")
        assert (run_dir / ".lock").read_text().split()[0] == str(holder.pid)
    finally:
        holder.kill()
        holder.wait(timeout=30)


def test_a_lock_held_by_a_child_of_a_dead_process_names_both(tmp_path):
    """The process named in the lock file has ended, but a process it forked still holds the
    lock (it inherited it): the run is refused, saying so, not blamed on the dead pid."""
    pytest.importorskip("fcntl")
    from normlab.train import RunLockedError
    from normlab.train.rundir import hold_run

    run_dir = tmp_path / "run"
    parent = subprocess.Popen(
        [sys.executable, "-c", "import os, time; from pathlib import Path; "
         "from normlab.train.rundir import hold_run\n"
         f"with hold_run(Path({str(run_dir)!r})):\n"
         "    if os.fork() == 0:\n"
         "        print(os.getpid(), flush=True); time.sleep(120); os._exit(0)\n"
         "    os._exit(0)  # at once, without letting go: the child holds the lock on"],
        env=ENV, stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    parent.wait(timeout=60)
    try:
        with pytest.raises(RunLockedError) as e, hold_run(run_dir):
            pass
        assert str(e.value).startswith(
            f"{run_dir}: locked by a process that process {parent.pid}, which no longer exists, "
            "started and that still runs (it inherited the lock")
    finally:
        os.kill(child, 9)


# -- 2: a damaged line in metrics.jsonl ---------------------------------------------------------

def test_resume_keeps_every_intact_record_around_a_damaged_line(reference, tmp_path):
    cfg, ref_dir, _ = reference
    run_dir = interrupted(cfg, tmp_path, 9)
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    cut = lines[4][: len(lines[4]) // 2]
    lines[4] = cut  # line 5 (step 5) cut in half, as by a bad copy or an editor
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    s, noted = train_noting(cfg, tmp_path)
    assert s["outcome"] in ("completed", "stalled")
    expected = [r for r in records(ref_dir) if r["step"] != 5]
    assert records(run_dir) == expected  # steps 1-4 and 6-12, bit for bit
    assert any("skipped 1 damaged line(s) (line 5)" in note for note in noted)
    assert any("line 5" in note for note in s["repairs"])
    assert (run_dir / "metrics.jsonl.damaged").read_text() == cut + "\n"


# -- 3 and 5: bad folders are listed as damaged, never hide the others ---------------------------

def _bad_folders(root: Path, good: Path) -> dict[str, str]:
    """Damaged run folders next to `good`; name -> a word the listing must show for it."""
    text = (good / "config.yaml").read_text()
    cases = {"badyaml": ("model: [unclosed\n", "YAML"),
             "binary": (b"\x89PNG\r\n\x1a\n\xff\xfe\x00", "not text"),
             "alist": ("- 1\n- 2\n", "list"),
             "lrnull": (text.replace("  lr: 0.001", "  lr: null"), "lr")}
    for name, (content, _) in cases.items():
        (root / name).mkdir()
        path = root / name / "config.yaml"
        path.write_bytes(content) if isinstance(content, bytes) else path.write_text(content)
    (root / "listsummary").mkdir()
    (root / "listsummary" / "config.yaml").write_text(text)
    (root / "listsummary" / "summary.json").write_text("[1, 2]")
    assert "lr: null" in (root / "lrnull" / "config.yaml").read_text()
    return {name: word for name, (_, word) in cases.items()} | {"listsummary": "list"}


def test_bad_folders_are_listed_as_damaged_by_runs_summarize_and_report(reference, tmp_path):
    from normlab.report.html import build_html

    _, ref_dir, ref = reference
    shutil.copytree(ref_dir, tmp_path / ref_dir.name)
    bad = _bad_folders(tmp_path, ref_dir)
    r = CliRunner().invoke(app, ["runs", str(tmp_path)], terminal_width=400)
    assert r.exit_code == 0, r.output
    out = " ".join(r.output.split())
    assert ref_dir.name in out and f"{ref['val_loss']:.4f}" in out
    rows = table_rows(r.output)
    assert "completed" in rows[ref_dir.name] or "stalled" in rows[ref_dir.name]
    for name, word in bad.items():
        assert "damaged" in rows[name] and word in rows[name], rows[name]
    table = collect(tmp_path)
    by_id = {row["run_id"]: row for row in table.rows}
    assert by_id[ref_dir.name]["outcome"] in ("completed", "stalled")
    for name, word in bad.items():
        assert by_id[name]["outcome"] == "damaged" and word in by_id[name]["reason"], name
    html = build_html(tmp_path)
    assert ref_dir.name in html and all(name in html for name in bad)


def test_train_on_a_folder_with_a_damaged_config_says_so(reference, tmp_path):
    cfg, ref_dir, _ = reference
    shutil.copytree(ref_dir, tmp_path / ref_dir.name)
    (tmp_path / ref_dir.name / "config.yaml").write_text("- a list\n")
    from normlab.train import RunFolderError

    with pytest.raises(RunFolderError, match="damaged.*config.yaml.*list"):
        train_run(cfg, tmp_path, progress=False)


# -- 4: a truncated summary.json ---------------------------------------------------------------

@pytest.mark.parametrize("damage", ["truncated", "list"])
def test_a_damaged_summary_of_a_completed_run_is_rebuilt_with_its_losses(reference, tmp_path,
                                                                        damage):
    cfg, ref_dir, ref = reference
    run_dir = tmp_path / ref_dir.name
    shutil.copytree(ref_dir, run_dir)
    text = (run_dir / "summary.json").read_text()
    (run_dir / "summary.json").write_text(text[: len(text) // 2] if damage == "truncated"
                                          else "[]")
    s = train_run(cfg, tmp_path, progress=False)
    assert s["outcome"] in ("completed", "stalled") and s["step"] == 12
    for key in ("train_loss", "val_loss", "best_val_loss"):
        assert s[key] == ref[key], key
    assert read_summary(run_dir) == s
    assert records(run_dir) == records(ref_dir)  # nothing retrained, nothing lost
    assert any("rebuilt" in note for note in s["repairs"])


# -- 6: the thread count ------------------------------------------------------------------------

def test_a_resume_keeps_the_thread_count_the_run_was_trained_with(tmp_path):
    cfg = tiny("train.steps=10", "train.checkpoint_every=3")
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        two = train_run(cfg, tmp_path / "two", progress=False)
        interrupted(cfg, tmp_path / "resumed", 6)
        torch.set_num_threads(1)
        one = train_run(cfg, tmp_path / "one", progress=False)
        run_two, run_one = (tmp_path / d / cfg.run_id() for d in ("two", "one"))
        # the premise: the thread count changes the numbers (CPU GEMMs split their sums)
        assert records(run_two) != records(run_one)
        resumed, noted = train_noting(cfg, tmp_path / "resumed")
        assert records(tmp_path / "resumed" / cfg.run_id()) == records(run_two)
        assert any("with the 2 CPU thread(s) it was trained with" in n for n in noted)
        assert torch.get_num_threads() == 1  # put back after the run
        assert two["threads"] == resumed["threads"] == 2 and one["threads"] == 1
        # asked to keep this process's count instead, a resume refuses and says how to resume
        from normlab.train import ThreadCountError

        interrupted(cfg, tmp_path / "refused", 3)
        with pytest.raises(ThreadCountError, match="--threads 1"):
            torch.set_num_threads(2)
            train_run(cfg, tmp_path / "refused", progress=False, threads="refuse")
    finally:
        torch.set_num_threads(before)


def test_train_with_another_explicit_thread_count_refuses_the_resume(tmp_path):
    """`normlab train --threads N` on a run interrupted under another count exits 2 and names
    the count to resume with; without --threads it resumes on the recorded count."""
    from normlab.cli import app

    cfg = tiny("train.steps=10", "train.checkpoint_every=3")
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        interrupted(cfg, tmp_path, 6)
        sets = [a for item in TINY + ["train.steps=10", "train.checkpoint_every=3"]
                for a in ("--set", item)]
        r = CliRunner().invoke(app, ["train", *sets, "--root", str(tmp_path), "--threads", "1",
                                     "--quiet"], terminal_width=200)
        assert r.exit_code == 2 and "--threads 2" in r.output, r.output
        r = CliRunner().invoke(app, ["train", *sets, "--root", str(tmp_path), "--quiet"],
                               terminal_width=200)
        assert r.exit_code == 0, r.output
    finally:
        torch.set_num_threads(before)


# -- 7: a crash between the two checkpoint renames ---------------------------------------------

@pytest.mark.parametrize("tmp_state", ["partial", "complete"])
def test_a_crash_between_the_checkpoint_renames_is_recovered(reference, tmp_path, tmp_state):
    """checkpoint.old and checkpoint.tmp, no checkpoint/: the resume continues from the newest
    complete one (a partial .tmp is ignored), not from step 0, and ends as the uninterrupted
    run."""
    cfg, ref_dir, ref = reference
    run_dir = interrupted(cfg, tmp_path, 3)
    shutil.copytree(run_dir / "checkpoint", tmp_path / "at3")
    interrupted(cfg, tmp_path, 6)
    ckpt = run_dir / "checkpoint"
    if tmp_state == "complete":  # the renames began: .tmp (step 6) was written to the end
        (tmp_path / "at3").rename(run_dir / "checkpoint.old")
        ckpt.rename(run_dir / "checkpoint.tmp")
    else:  # .old is the checkpoint of step 6; a .tmp cut short by a disk error
        ckpt.rename(run_dir / "checkpoint.old")
        (tmp_path / "at3").rename(run_dir / "checkpoint.tmp")
        weights = run_dir / "checkpoint.tmp" / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:1000])
    s, noted = train_noting(cfg, tmp_path, interrupt_at=0)  # stops where it resumes
    assert s["outcome"] == "interrupted" and s["step"] == 6
    assert any("recovered from checkpoint" in note for note in noted)
    assert any("recovered" in note for note in s["repairs"])
    assert sorted(p.name for p in run_dir.glob("checkpoint*")) == ["checkpoint"]
    done = train_run(cfg, tmp_path, progress=False)
    assert done["val_loss"] == ref["val_loss"] and records(run_dir) == records(ref_dir)


# -- malformed checkpoint state ------------------------------------------------------------------

def _list(state):
    return [state]


def _no_spike(state):
    return {k: v for k, v in state.items() if k != "spike"}


def _step_text(state):
    return state | {"step": str(state["step"])}


def _bad_spike(state):
    return state | {"spike": state["spike"] | {"mean": "high"}}


@pytest.mark.parametrize("mutate,match", [
    (_list, "a JSON list"), (_no_spike, "spike.*missing"), (_step_text, "step is '3'"),
    (_bad_spike, "spike: mean"), ("rng", "rng.safetensors"), ("rng_missing", "corrupted"),
])
def test_malformed_checkpoint_state_is_a_checkpoint_error(reference, tmp_path, mutate, match):
    from safetensors.torch import save_file

    cfg = reference[0]
    ckpt = interrupted(cfg, tmp_path, 3) / "checkpoint"
    if mutate == "rng":
        save_file({"torch_cpu": torch.zeros(10, dtype=torch.uint8)}, str(ckpt / "rng.safetensors"))
    elif mutate == "rng_missing":
        (ckpt / "rng.safetensors").unlink()
    else:
        state = json.loads((ckpt / "trainer_state.json").read_text())
        (ckpt / "trainer_state.json").write_text(json.dumps(mutate(state)))
    with pytest.raises(CheckpointError, match=match):
        train_run(cfg, tmp_path, progress=False)
    if mutate == "rng":  # through the CLI: exit 2, the file named, no traceback
        r = subprocess.run(normlab_cmd("train", "--resume", str(ckpt.parent), "--quiet"),
                           env=ENV, capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and "rng.safetensors" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr


# -- normlab runs: the fields in which the runs differ; a finished run is skipped -----------------

def test_runs_lists_the_fields_that_differ_and_a_finished_run_is_skipped(reference, tmp_path,
                                                                         capsys):
    cfg, ref_dir, ref = reference
    shutil.copytree(ref_dir, tmp_path / ref_dir.name)
    other = train_run(tiny("train.steps=12", "train.checkpoint_every=3", "train.seed=1"),
                      tmp_path, progress=False)
    r = CliRunner().invoke(app, ["runs", str(tmp_path)], terminal_width=400)
    assert r.exit_code == 0, r.output
    header = next(ln for ln in r.output.splitlines() if "outcome" in ln)
    cols = [c.strip() for c in header.split("┃")[1:-1]]
    assert cols == ["run", "seed", "outcome", "step", "train loss", "val loss", "best val"]
    rows = table_rows(r.output)
    assert rows[ref_dir.name].split()[0] == "0" and rows[other["run_id"]].split()[0] == "1"
    capsys.readouterr()
    assert train_run(cfg, tmp_path, progress=True) == ref
    assert re.search(r"already (completed|stalled) at step 12, skipped", capsys.readouterr().err)


def test_metrics_reader_tells_a_cut_last_line_from_a_damaged_one():
    from normlab.train.rundir import parse_metrics

    text = '{"step": 1}\n{"step": 2, "tra\n[3]\n{"step": 4}\n{"step": 5, "train'
    records, damaged = parse_metrics(text)
    assert [r["step"] for r, _ in records] == [1, 4]
    # line 2 (cut) and line 3 (not a record) are damaged; the unterminated last line is a write
    # cut by a kill, past the last checkpoint, and is not reported
    assert [n for n, _ in damaged] == [2, 3]


def test_a_rerun_says_it_resumes_and_an_interrupt_says_how_to_continue(tmp_path, monkeypatch,
                                                                       capsys):
    """Re-running an interrupted run's command continues it and says from which step; an
    interrupted `normlab train` prints the command that continues it."""
    import normlab.train
    from normlab.cli import app

    cfg = tiny("train.steps=10", "train.checkpoint_every=3")
    run_dir = interrupted(cfg, tmp_path, 6)
    s = train_run(cfg, tmp_path, progress=True)
    assert s["outcome"] in ("completed", "stalled")
    assert f"{run_dir.name}: resuming from step 6 of 10 (its checkpoint)" in \
        capsys.readouterr().err
    quiet = tiny("train.steps=4")
    train_run(quiet, tmp_path / "fresh", progress=True)
    assert "resuming" not in capsys.readouterr().err  # a fresh run does not say so

    stopped = {"run_id": run_dir.name, "outcome": "interrupted", "step": 6,
               "reason": "signal"}
    monkeypatch.setattr(normlab.train, "train_run", lambda *a, **k: stopped)
    sets = [a for item in TINY + ["train.steps=10", "train.checkpoint_every=3"]
            for a in ("--set", item)]
    r = CliRunner().invoke(app, ["train", *sets, "--root", str(tmp_path), "--quiet"],
                           terminal_width=300)
    assert r.exit_code == 130
    # the console wraps long lines (a deep tmp path can pass its width): compare the words
    assert f"to continue: normlab train --resume {tmp_path / run_dir.name} (or the same " \
        "command again)" in " ".join(r.output.split())
