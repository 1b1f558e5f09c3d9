"""Placements of your own, without a fork: defined in a placements file or registered from
Python, they build the same plan (and the same numbers) as the built-in placement they re-declare,
are recorded and hashed by definition, print in `normlab plan`, sweep and stack; a bad definition
is refused naming its field, its line and the valid choices."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import normlab
from normlab import placements
from normlab.cli import app, load_commands
from normlab.config import ConfigError, RunConfig, load_run_config, make_model_config, parse_config
from normlab.nn import build_model
from normlab.nn.plan import build_plan
from normlab.nn.stacked import StackedTransformer
from normlab.sweep import collect, plan_sweep, run_sweep
from normlab.sweep.grouping import plan_tasks
from normlab.train import train_run
from normlab.train.rundir import read_metrics

MINE = """\
placements:
  mypre:
    doc: Pre-Norm, declared as data
    init: gpt2_scaled
    final_norm: true
    attn: {in_norm: true}
    mlp: {in_norm: true}
  post_first:
    doc: one Post-Norm block, then Pre-Norm blocks
    blocks:
      - {count: 1, attn: {post_norm: true}, mlp: {post_norm: true}}
      - {attn: {in_norm: true}, mlp: {in_norm: true}}
"""
SHAPE = {"n_blocks": 3, "d_model": 16, "n_heads": 2, "max_seq_len": 16}
TINY_RUN = ["model.n_blocks=2", "model.d_model=16", "model.n_heads=2", "model.max_seq_len=16",
            "data.seq_len=16", "train.steps=3", "train.batch_size=4", "train.eval_batches=1",
            "train.eval_every=3", "train.log_every=1", "train.device=cpu"]
runner = CliRunner()


@pytest.fixture(autouse=True)
def no_registrations(monkeypatch):
    """Each test starts with no placement registered, and leaves none behind."""
    monkeypatch.setattr(placements, "USER", {})


@pytest.fixture
def mine(tmp_path) -> Path:
    path = tmp_path / "my_placements.yaml"
    path.write_text(MINE)
    return path


def test_a_yaml_placement_equal_to_pre_builds_pre_bit_for_bit(mine):
    ours = make_model_config(placement="mypre", placement_file=str(mine), **SHAPE)
    pre = make_model_config(placement="pre", **SHAPE)
    plan, ref = build_plan(ours), build_plan(pre)
    assert [b.sublayers for b in plan.blocks] == [b.sublayers for b in ref.blocks]
    assert (plan.init, plan.final_norm, plan.embed_norm) == (ref.init, ref.final_norm, None)
    idx = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(build_model(ours, seed=3)(idx).logits,
                           build_model(pre, seed=3)(idx).logits)


def test_a_yaml_placement_equal_to_pre_trains_to_the_same_losses(mine, tmp_path):
    ours = load_run_config(None, [*TINY_RUN, "model.placement=mypre",
                                  f"model.placement_file={mine}"])
    pre = load_run_config(None, [*TINY_RUN, "model.placement=pre"])
    losses = []
    for cfg in (ours, pre):
        s = train_run(cfg, tmp_path / "runs", progress=False)
        assert s["outcome"] in ("completed", "stalled"), s
        rows = read_metrics(tmp_path / "runs" / cfg.run_id() / "metrics.jsonl")
        losses.append([(r["train_loss"], r["grad_norm"], r.get("val_loss")) for r in rows])
    assert len(losses[0]) == 3 and losses[0] == losses[1]
    assert ours.run_id().startswith("mypre-") and ours.run_id() != pre.run_id()


def test_per_depth_blocks_and_their_count_checks(mine):
    cfg = make_model_config(placement="post_first", placement_file=str(mine), **SHAPE)
    plan = build_plan(cfg)
    assert [b.attn.post_norm for b in plan.blocks] == ["layernorm", None, None]
    assert [b.attn.in_norm for b in plan.blocks] == [None, "layernorm", "layernorm"]
    assert plan.final_norm == "layernorm"  # derived: the last block ends without a post norm
    both_counted = {"blocks": [{"count": 1, "attn": {"post_norm": True}},
                               {"count": 1, "attn": {"in_norm": True}}]}
    with pytest.raises(ConfigError, match=r"counts add up to 2 blocks, the model has "
                                          r"n_blocks=3; set n_blocks=2"):
        make_model_config(placement="two", placement_def=both_counted, **SHAPE)
    assert len(build_plan(make_model_config(placement="two", placement_def=both_counted,
                                            **{**SHAPE, "n_blocks": 2})).blocks) == 2


def test_the_run_id_hashes_the_definition_not_the_path_or_the_doc(mine, tmp_path):
    def run_id(path: Path) -> str:
        return load_run_config(None, ["model.placement=mypre",
                                      f"model.placement_file={path}"]).run_id()

    first = run_id(mine)
    moved = tmp_path / "elsewhere.yaml"
    shutil.copy(mine, moved)
    assert run_id(moved) == first  # the file's path is not what is computed
    mine.write_text(MINE.replace("Pre-Norm, declared as data", "another doc"))
    assert run_id(mine) == first  # nor its doc
    mine.write_text(MINE.replace("mlp: {in_norm: true}\n  post_first",
                                 "mlp: {in_norm: true, in_scale: 0.5}\n  post_first"))
    assert run_id(mine) != first


def test_a_recorded_config_rebuilds_without_the_file_or_the_registration(mine):
    """config.yaml holds the definition (not the path): a resume, a worker or `normlab sample`
    in another process builds the same run from it alone."""
    cfg = load_run_config(None, [*TINY_RUN, "model.placement=mypre",
                                 f"model.placement_file={mine}"])
    recorded = cfg.to_dict()
    assert "placement_file" not in recorded["model"]
    assert recorded["model"]["placement_def"]["attn"]["in_norm"] is True
    mine.unlink()
    again = parse_config(RunConfig, recorded)
    assert again.run_id() == cfg.run_id() and again.model.placement_def == cfg.model.placement_def
    normlab.register_placement("regpre", attn={"in_norm": True}, mlp={"in_norm": True})
    registered = make_model_config(placement="regpre").to_dict()
    placements.USER.clear()
    assert make_model_config(**registered).placement_def.attn.in_norm


def test_a_registered_placement_is_usable_and_shows_in_normlab_plan():
    normlab.register_placement("gated_pre", attn={"in_norm": True, "gate_init": 0.0},
                               mlp={"in_norm": True, "gate_init": 0.0}, init="gpt2_scaled",
                               final_norm=True, doc="pre with a ReZero gate")
    cfg = make_model_config(placement="gated_pre", n_blocks=2)
    assert build_plan(cfg).blocks[0].attn.gate_init == 0.0
    load_commands()
    result = runner.invoke(app, ["plan", "--placement", "gated_pre", "--blocks", "2"])
    assert result.exit_code == 0, result.output
    assert "gated_pre: yours, registered by register_placement (test_user_placements.py:" in \
        result.output
    assert ": pre with a ReZero gate" in result.output
    assert "block   1 mlp  [gated_pre]  x = x + g*MLP(LN(x))   [g0=0]" in result.output
    # the config's gate_init overrides the definition's, as it does rezero's
    assert build_plan(make_model_config(placement="gated_pre", gate_init=0.5)
                      ).blocks[0].mlp.gate_init == 0.5


def test_normlab_plan_reads_a_placements_file(mine):
    load_commands()
    result = runner.invoke(app, ["plan", "--placements", str(mine), "--placement", "post_first",
                                 "--blocks", "2"])
    assert result.exit_code == 0, result.output
    assert f"post_first: yours, defined in {mine}: one Post-Norm block" in result.output
    assert "block   0 attn [post_first]  x = LN(x + Attn(x))" in result.output
    assert "block   1 attn [post_first]  x = x + Attn(LN(x))" in result.output


BAD_FILE = """\
placements:
  pre:
    attn: {in_norm: true}
  Bad-Name: {}
  mine:
    init: gpt3
    attn:
      in_nrom: true
    mlp: {qkv_norm: true}
  both:
    attn: {in_norm: true}
    blocks: [{attn: {post_norm: true}}]
extra: 1
"""


def test_a_bad_placements_file_names_each_problem_by_line_and_field(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(BAD_FILE)
    with pytest.raises(ConfigError) as e:
        make_model_config(placement="mine", placement_file=str(bad))
    lines = str(e.value).splitlines()[2:]
    assert lines == [
        f"  placements.pre (line 2): 'pre' is a built-in placement; give yours another name "
        f"(built in: {', '.join(placements.PLACEMENTS)})",
        "  placements.Bad-Name (line 4): the name 'Bad-Name' is not lower-case letters, digits "
        "and _, starting with a letter; rename it",
        "  placements.mine.init (line 6): 'gpt3' is not an init scheme; choose from normal, "
        "gpt2_scaled, xavier, deepnorm, admin, ds_init, subln",
        "  placements.mine.attn.in_nrom (line 8): unknown key (did you mean 'in_norm'?); valid "
        "keys are: in_norm, in_scale, out_norm, post_norm, skip_scale, skip_learned, gate_init, "
        "add_block_input, qkv_norm, skip_normed, inner_norm, head_scale, qk_norm",
        "  placements.mine.mlp (line 9): qkv_norm: Q, K and V are the attention's; set it under "
        "attn",
        "  placements.both (line 10): attn, mlp and blocks: give the block at every depth (attn, "
        "mlp) or the blocks by depth (blocks), not both",
        "  extra (line 13): unknown key; the file has one key, placements",
    ]


@pytest.mark.parametrize(("fields", "match"), [
    ({"placement": "mypr"}, r"got 'mypr'; a placement is a built-in one \('post', 'pre', .*\) or "
                            r"one of your own, defined in placement_file"),
    ({"placement": "prenorm"}, r"got 'prenorm' \(did you mean 'pre'\?\)"),
    ({"placement": "pre", "placement_def": {"attn": {"in_norm": True}}},
     r"placement_def: defines a placement of your own, but placement is the built-in 'pre'"),
    ({"placement": "x", "placement_def": {"attn": {"skip_normed": True}}},
     r"placement_def.attn: skip_normed: takes the residual after in_norm; set in_norm: true"),
    ({"placement": "x", "placement_def": {"blocks": [{"attn": {"in_norm": True}}, {}]}},
     r"placement_def.blocks: entry 0 has no count"),
    ({"placement": "x", "norm": "dyt", "placement_def": {"attn": {"qkv_norm": True}}},
     r"norm: placement_def normalizes Q, K and V per head \(qkv_norm\), which dyt does not "
     r"support"),
    ({"placement": "x", "attention": "none", "placement_def": {"mlp": {"add_block_input": True}}},
     r"attention: placement_def's add_block_input is a skip around the attention sublayer"),
    ({"placement": "x", "placement_file": "no/such.yaml"}, r"placements file no/such.yaml: not "
                                                           r"found"),
])
def test_bad_definitions_and_names_are_refused_saying_why(fields, match):
    with pytest.raises(ConfigError, match=match):
        make_model_config(**fields)


def test_a_name_the_file_does_not_define_is_refused_with_the_file_s_names(mine):
    with pytest.raises(ConfigError, match=r"'mypr' is not built in and not defined in "
                                          r"placement_file .* \(did you mean 'mypre'\?\); it "
                                          r"defines mypre, post_first"):
        make_model_config(placement="mypr", placement_file=str(mine))


def test_register_placement_refuses_a_bad_one():
    with pytest.raises(ConfigError, match=r"'post' is a built-in placement; give yours another"):
        normlab.register_placement("post", attn={"post_norm": True})
    with pytest.raises(ConfigError, match=r"name 'My Pre': use lower-case letters"):
        normlab.register_placement("My Pre")
    with pytest.raises(ConfigError, match=r"mine.attn.in_nrom: unknown key \(did you mean "
                                          r"'in_norm'\?\)"):
        normlab.register_placement("mine", attn={"in_nrom": True})
    normlab.register_placement("mine", attn={"in_norm": True})
    normlab.register_placement("mine", attn={"in_norm": True})  # the same again: nothing
    with pytest.raises(ConfigError, match=r"'mine' is registered already \(registered by "
                                          r"register_placement .*\) with another definition; "
                                          r"pass replace=True"):
        normlab.register_placement("mine", attn={"post_norm": True})
    normlab.register_placement("mine", attn={"post_norm": True}, replace=True)
    assert build_plan(make_model_config(placement="mine")).blocks[0].attn.post_norm
    with pytest.raises(ConfigError, match=r"got 'mien' \(did you mean 'mine'\?\).*"
                                          r"\(registered: mine\)"):
        make_model_config(placement="mien")


def test_stacked_members_of_a_yaml_placement_equal_those_of_pre(mine):
    """The stacked engine runs a placement of your own as it runs the built-in one it
    re-declares: same plan, same stacked numbers."""
    ours = make_model_config(placement="mypre", placement_file=str(mine), **SHAPE)
    pre = make_model_config(placement="pre", **SHAPE)
    idx = torch.randint(0, 256, (2, 2, 16), generator=torch.Generator().manual_seed(1))
    outs = []
    for cfg in (ours, pre):
        stacked = StackedTransformer([build_model(cfg, seed=s) for s in range(2)])
        with torch.no_grad():
            outs.append(stacked(idx, idx).loss)
    assert torch.equal(outs[0], outs[1])


def test_a_sweep_over_pre_and_a_yaml_placement_runs(mine, tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"""\
base:
  model: {{n_blocks: 2, d_model: 16, n_heads: 2, max_seq_len: 16, placement_file: {mine}}}
  data: {{seq_len: 16}}
  train: {{steps: 3, batch_size: 4, eval_batches: 1, eval_every: 3, device: cpu}}
engine: stacked
axes:
  model.placement: [pre, mypre]
  train.seed: [0, 1]
""")
    plan = plan_sweep(spec)
    assert [r.config.model.placement for r in plan.runs] == ["pre", "pre", "mypre", "mypre"]
    tasks, _ = plan_tasks(plan.runs, "stacked", workers=1)  # the seeds of each placement stack
    assert [len(t.run_ids) for t in tasks] == [2, 2] and tasks[1].members[0].config["model"][
        "placement_def"]["attn"]["in_norm"] is True  # a worker gets the definition, not a path
    result = run_sweep(plan, tmp_path / "sweep", workers=1, progress=False)
    assert set(result.outcomes.values()) <= {"completed", "stalled"}, result.outcomes
    table = collect(result.root)
    assert sorted(r["model.placement"] for r in table.rows) == ["mypre", "mypre", "pre", "pre"]
    with pytest.raises(ConfigError, match=r"axis model.placement = mypr \(with train.seed=0\): "
                                          r"model: placement: 'mypr' is not built in and not "
                                          r"defined in placement_file"):
        plan_sweep(spec.read_text().replace("[pre, mypre]", "[pre, mypr]"))


def test_the_reference_page_shows_the_shipped_example_and_its_plan(monkeypatch):
    """docs/reference.md's worked example is examples/placements/my_placements.yaml, and the plan
    it prints is what `normlab plan` prints for it."""
    repo = Path(__file__).resolve().parents[1]
    example = repo / "examples" / "placements" / "my_placements.yaml"
    page = (repo / "docs" / "reference.md").read_text()
    section = page.split("### Placements of your own", 1)[1].split("\n### ", 1)[0]
    assert f"```yaml\n{example.read_text()}```" in section
    assert set(placements.read_placements_file(example)) == {"mypre", "post_first"}
    load_commands()
    monkeypatch.chdir(repo)  # the page gives the path from the repository
    result = runner.invoke(app, ["plan", "--placements", str(example.relative_to(repo)),
                                 "--placement", "mypre", "--blocks", "2"])
    assert result.exit_code == 0, result.output
    assert f"```text\n{result.output}```" in section


def test_a_listing_shows_a_definition_as_one_digest():
    """`normlab runs` shows a user placement's definition as one short value, not a column per
    norm switch; two definitions get two digests."""
    from normlab.train.listing import differing_paths, flatten

    a = flatten({"model": {"placement": "mine", "placement_def": {"attn": {"in_norm": True}}}})
    b = flatten({"model": {"placement": "mine", "placement_def": {"attn": {"out_norm": True}}}})
    assert list(a) == ["model.placement", "model.placement_def"]
    assert a["model.placement_def"].startswith("def-") and len(a["model.placement_def"]) == 12
    assert differing_paths([a, b]) == ["model.placement_def"]


def test_probe_at_init_compares_a_yaml_placement_with_pre(mine, tmp_path):
    """`normlab probe --placements pre,mypre --set model.placement_file=FILE` probes both; a
    copy of pre measures as pre does; a name in no file is refused with the way to define it."""
    import json

    out = tmp_path / "probe"
    args = ["probe", "--placements", "pre,mypre", "--blocks", "2", "--width", "16", "--heads",
            "2", "--probes", "stream", "--set", f"model.placement_file={mine}"]
    result = runner.invoke(app, [*args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    runs = json.loads((out / "probe.json").read_text())["runs"]
    by = {r["placement"]: r["result"] for r in runs}
    assert set(by) == {"pre", "mypre"}
    same = [k for k in by["pre"] if k != "model"]
    assert same and all(by["pre"][k] == by["mypre"][k] for k in same)
    result = runner.invoke(app, ["probe", "--placements", "pre,nosuch", "--blocks", "2"])
    assert result.exit_code == 2 and "model.placement_file=FILE" in result.output
