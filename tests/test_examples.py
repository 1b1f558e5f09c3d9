"""The run configs shipped in examples/ (the README's tour trains them) load, build and train."""

from __future__ import annotations

from pathlib import Path

import pytest

from normlab.config import load_run_config
from normlab.nn import build_model
from normlab.nn.plan import resolved_settings
from normlab.train import train_run

EXAMPLES = sorted((Path(__file__).parents[1] / "examples").glob("*.yaml"))


def test_the_examples_ship():
    assert {p.stem for p in EXAMPLES} == {"pre", "post", "modern", "khop"}


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_an_example_loads_builds_and_trains(path, tmp_path):
    cfg = load_run_config(path)
    assert cfg.train.name and "example" in cfg.train.tags
    model = build_model(cfg.model, seed=0)
    assert model.num_params() < 500_000  # small enough for a minute or two on a CPU
    quick = load_run_config(path, ["train.steps=2", "train.eval_batches=1"])
    s = train_run(quick, tmp_path, progress=False)
    assert s["outcome"] in ("completed", "stalled"), s
    assert s["step"] == 2 and s["name"] == cfg.train.name


def test_the_examples_differ_where_their_names_say():
    by = {p.stem: load_run_config(p).model for p in EXAMPLES}
    assert resolved_settings(by["pre"])["init"] == "gpt2_scaled"
    assert resolved_settings(by["post"])["init"] == "xavier"
    m = by["modern"]
    assert (m.placement, m.norm, m.mlp, m.positions) == ("pre", "rmsnorm", "swiglu", "rope")
    # pre and post are one model but for the placement
    assert by["pre"].model_copy(update={"placement": "post"}) == by["post"]


def test_the_readme_s_python_snippet_loads_a_trained_run(tmp_path, capsys):
    """The README's "a trained run in Python" block, run on a two-step run of the pre example."""
    import re

    readme = (Path(__file__).parents[1] / "README.md").read_text()
    code = re.search(r"A trained run in Python:\n\n```python\n(.*?)```", readme, re.S).group(1)
    quick = load_run_config(EXAMPLES[[p.stem for p in EXAMPLES].index("pre")],
                            ["train.steps=2", "train.eval_batches=1"])
    s = train_run(quick, tmp_path, progress=False)
    assert "runs/RUN_ID" in code
    exec(compile(code.replace("runs/RUN_ID", str(tmp_path / s["run_id"])), "README.md", "exec"),
         {})
    printed = capsys.readouterr().out
    assert len(printed) == 2 and printed.endswith("\n")  # one byte, decoded, and its newline
