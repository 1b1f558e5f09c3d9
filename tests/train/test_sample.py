"""`normlab sample RUN_DIR --prompt TEXT`: text from a trained run's byte-level model, seeded and
repeatable; a missing or wrong folder is one clear error (exit 2). An unfinished run, and a run
at a given step (`RUN@STEP`): tests/cli/test_run_at_step.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from normlab.cli import app
from normlab.config import load_run_config
from normlab.train import load_trained_model, train_run
from normlab.train.sample import SampleError, generate, sample_run

TINY = ["model.n_blocks=1", "model.d_model=32", "model.n_heads=2", "model.max_seq_len=16",
        "data.seq_len=16", "train.batch_size=4", "train.eval_batches=1", "train.eval_every=0",
        "train.device=cpu"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("runs")
    done = train_run(load_run_config(None, [*TINY, "train.steps=3"]), root, progress=False)
    cut = train_run(load_run_config(None, [*TINY, "train.steps=50", "train.seed=1"]), root,
                    progress=False, interrupt_at=2)
    return {"done": root / done["run_id"], "cut": root / cut["run_id"], "root": root}


def cli(*args: str):
    return CliRunner().invoke(app, ["sample", *map(str, args)], terminal_width=200)


def test_sample_prints_the_prompt_and_its_continuation(runs):
    r = cli(runs["done"], "--prompt", "ROMEO:", "--tokens", "40", "--seed", "3")
    assert r.exit_code == 0, r.output
    assert r.output.startswith("ROMEO:")
    again = cli(runs["done"], "--prompt", "ROMEO:", "--tokens", "40", "--seed", "3")
    assert again.output == r.output  # the draws are seeded
    other = cli(runs["done"], "--prompt", "ROMEO:", "--tokens", "40", "--seed", "4")
    assert other.output != r.output


def test_generate_continues_by_the_asked_number_of_tokens_past_the_context(runs):
    cfg, model = load_trained_model(runs["done"])
    idx = torch.randint(0, 256, (2, 5), generator=torch.Generator().manual_seed(0))
    n = cfg.model.max_seq_len + 4  # longer than the context: the window slides
    out = generate(model, idx, n, temperature=0.0)
    assert out.shape == (2, 5 + n) and torch.equal(out[:, :5], idx)
    # greedy: each token is the argmax given the window before it
    last = model(out[:, -cfg.model.max_seq_len - 1:-1]).logits[:, -1].argmax(-1)
    assert torch.equal(out[:, -1], last)
    # top_k=1 draws the greedy choice whatever the temperature
    assert torch.equal(generate(model, idx, 6, temperature=2.0, top_k=1,
                                generator=torch.Generator().manual_seed(1)), out[:, :11])


def test_sample_run_returns_only_the_continuation(runs):
    from normlab.data.tokens import decode, encode

    text = sample_run(runs["done"], "abc", tokens=10, temperature=0.0)
    _, model = load_trained_model(runs["done"])
    idx = torch.from_numpy(encode("abc").astype("int64"))[None]
    assert text == decode(generate(model, idx, 10, temperature=0.0)[0, 3:])


@pytest.mark.parametrize("target,needle", [
    ("nope", "nope: no such run folder"),
    ("file", "is a file; give a run folder"),
    ("root", "not a run folder (no config.yaml)"),
])
def test_a_folder_that_cannot_be_sampled_is_named(runs, tmp_path, target, needle):
    (tmp_path / "file").write_text("x")
    path = runs.get(target, tmp_path / target)
    r = cli(path, "--prompt", "a")
    assert r.exit_code == 2, r.output
    assert needle in " ".join(r.output.split())
    with pytest.raises(SampleError):
        sample_run(path, "a")


@pytest.mark.parametrize("args,needle", [
    (["--tokens", "0"], "--tokens"), (["--temperature", "-1"], "--temperature"),
    (["--temperature", "nan"], "--temperature"), (["--top-k", "0"], "--top-k"),
    (["--top-k", "300"], "--top-k"), (["--prompt", ""], "--prompt is empty")])
def test_bad_settings_exit_2(runs, args, needle):
    r = cli(runs["done"], *args)
    assert r.exit_code == 2 and needle in r.output, r.output


def test_the_documented_python_example_runs(runs, capsys):
    """docs/probes.md's `load_trained_model` example, on a tiny trained run."""
    doc = (Path(__file__).parents[2] / "docs" / "probes.md").read_text()
    section = doc.split("A trained run from Python:", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert "load_trained_model(" in code and "generate(" in code
    code = code.replace('"runs/<run_id>"', repr(str(runs["done"])))
    exec(compile(code, "docs/probes.md", "exec"), {})
    assert capsys.readouterr().out.startswith("ROMEO:")


def test_a_run_is_found_by_its_name_or_a_unique_prefix_of_its_id(tmp_path, monkeypatch):
    """Under ./runs a run is named by its id, a unique prefix of it, or its train.name; a
    prefix or name shared by two runs is an error that lists them."""
    from normlab.train.rundir import find_run

    root = tmp_path / "runs"
    a = train_run(load_run_config(None, [*TINY, "train.steps=2", "train.name=first"]), root,
                  progress=False)["run_id"]
    b = train_run(load_run_config(None, [*TINY, "train.steps=2", "train.seed=1",
                                         "train.name=twin"]), root, progress=False)["run_id"]
    c = train_run(load_run_config(None, [*TINY, "train.steps=2", "train.seed=2",
                                         "train.name=twin"]), root, progress=False)["run_id"]
    monkeypatch.chdir(tmp_path)
    assert find_run(a) == Path("runs") / a  # the id alone, found under ./runs
    assert find_run(a[:-4]) == Path("runs") / a
    assert find_run("first") == Path("runs") / a
    assert find_run("nothing") == Path("nothing")  # for the caller to say it does not exist
    assert find_run(Path("runs") / b) == Path("runs") / b
    by_name = cli("first", "--tokens", "5")
    assert by_name.exit_code == 0, by_name.output
    assert by_name.output == cli(Path("runs") / a, "--tokens", "5").output
    shared = cli("twin")
    assert shared.exit_code == 2
    assert "twin: names 2 runs under runs (" in " ".join(shared.output.split())
    assert b in shared.output.replace("\n", "") and c in shared.output.replace("\n", "")
    common = a[:a.index("-") + 1]  # every run id starts with its placement and depth
    assert cli(common).exit_code == 2
