"""`normlab sample` and `normlab probe --checkpoint` take a run at a step, `RUN@STEP` (its latest
checkpoint's step or one it kept with `train.keep_checkpoints`), and an unfinished run's latest
checkpoint; each says which weights it read. A step without weights is exit 2 listing the steps
there are."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from normlab.cli import app
from normlab.config import load_run_config
from normlab.data.tokens import decode, encode
from normlab.train import load_trained_model, train_run
from normlab.train.rundir import RunFolderError, split_run_step
from normlab.train.sample import generate, sample_run

TINY = ["model.n_blocks=1", "model.d_model=16", "model.n_heads=2", "model.max_seq_len=16",
        "data.seq_len=16", "train.batch_size=4", "train.eval_batches=1", "train.eval_every=0",
        "train.device=cpu", "train.lr=1e-2"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("runs")
    kept = train_run(load_run_config(None, [*TINY, "train.steps=3", "train.checkpoint_every=1",
                                            "train.keep_checkpoints=true"]), root,
                     progress=False)
    cut = train_run(load_run_config(None, [*TINY, "train.steps=50", "train.seed=1"]), root,
                    progress=False, interrupt_at=2)
    assert cut["outcome"] == "interrupted"
    return {"kept": root / kept["run_id"], "cut": root / cut["run_id"]}


def invoke(*args: object):
    return CliRunner().invoke(app, [str(a) for a in args], terminal_width=300)


def said(r) -> str:
    return " ".join(r.output.split())


def greedy(model, prompt: str, n: int) -> str:
    idx = torch.from_numpy(encode(prompt).astype("int64"))[None]
    return decode(generate(model, idx, n, temperature=0.0)[0, idx.size(1):])


def test_run_at_step_is_parsed_in_one_place(tmp_path):
    assert split_run_step("runs/abc@200") == (Path("runs/abc"), 200)
    assert split_run_step("abc") == (Path("abc"), None)
    odd = tmp_path / "a@1"  # a folder whose name has an @ is itself
    odd.mkdir()
    assert split_run_step(odd) == (odd, None)
    for bad in ("abc@", "abc@x", "abc@-1", "@3"):
        with pytest.raises(RunFolderError, match="give RUN@STEP with STEP a step count"):
            split_run_step(bad)


def test_sample_reads_the_weights_of_a_kept_step(runs):
    run = runs["kept"]
    _, at1 = load_trained_model(run, step=1)
    _, final = load_trained_model(run)
    assert sample_run(f"{run}@1", "ab", tokens=12, temperature=0.0) == greedy(at1, "ab", 12)
    assert sample_run(f"{run}@3", "ab", tokens=12, temperature=0.0) == greedy(final, "ab", 12)
    r = invoke("sample", f"{run}@1", "--prompt", "ab", "--tokens", "12", "--temperature", "0")
    assert r.exit_code == 0, r.output
    assert r.output.startswith("ab" + greedy(at1, "ab", 12))
    assert f"sampled from {run}@1 (step 1 of 3, kept weights)" in said(r)
    latest = invoke("sample", run, "--tokens", "4")
    assert f"sampled from {run}@3 (step 3 of 3, its final checkpoint)" in said(latest)
    assert "not finished" not in said(latest)


@pytest.mark.parametrize("command", [["sample"], ["probe", "--checkpoint"]])
def test_a_step_without_weights_lists_the_steps_there_are(runs, command):
    run = runs["kept"]
    r = invoke(*command, f"{run}@7")
    assert r.exit_code == 2, r.output
    assert (f"{run}: no weights kept at step 7 (kept: [1, 2]; latest checkpoint: step 3)"
            in said(r))
    assert "Traceback" not in r.output
    bad = invoke(*command, f"{run}@last")
    assert bad.exit_code == 2 and "give RUN@STEP with STEP a step count" in said(bad)


def test_sample_of_an_unfinished_run_reads_its_latest_checkpoint_and_says_so(runs):
    run = runs["cut"]
    r = invoke("sample", run, "--prompt", "ab", "--tokens", "6", "--temperature", "0")
    assert r.exit_code == 0, r.output
    _, model = load_trained_model(run)
    assert r.output.startswith("ab" + greedy(model, "ab", 6))
    assert (f"sampled from {run}@2 (step 2 of 50, its latest checkpoint); the run is "
            "interrupted at step 2, not finished") in said(r)


def test_a_diverged_run_is_sampled_only_at_a_step_given(runs, tmp_path):
    import shutil

    run = tmp_path / runs["kept"].name
    shutil.copytree(runs["kept"], run)
    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps(summary | {"outcome": "diverged"}))
    r = invoke("sample", run)
    assert r.exit_code == 2 and "give a step it kept before, as RUN@STEP" in said(r)
    r = invoke("sample", f"{run}@1", "--tokens", "3")
    assert r.exit_code == 0, r.output
    assert "the run is diverged at step 3, not finished" in said(r)


def test_probe_takes_run_at_step_and_says_which_weights(runs, tmp_path):
    run = runs["kept"]
    out = tmp_path / "out"
    r = invoke("probe", "--checkpoint", f"{run}@1", "--out", out, "--batches", "1",
               "--batch-size", "2", "--probes", "stream", "--no-figures")
    assert r.exit_code == 0, r.output
    assert f"probing {run}@1 (step 1 of 3, kept weights)" in said(r)
    report = json.loads((out / "probe.json").read_text())
    assert report["checkpoint"] == f"{run}@1"
    cut = invoke("probe", "--checkpoint", runs["cut"], "--out", tmp_path / "cut", "--batches",
                 "1", "--batch-size", "2", "--probes", "stream", "--no-figures")
    assert cut.exit_code == 0, cut.output
    assert "the run is interrupted at step 2, not finished" in said(cut)
