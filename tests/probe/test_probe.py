"""Probes on cases with known answers (docs/reference.md section 2: C1-C4, C8, C13), on every
placement and both model kinds, on a trained checkpoint, and through the command line."""

from __future__ import annotations

import json
import math
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
import typer  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from normlab.cli.probe import probe  # noqa: E402
from normlab.config import PLACEMENTS, load_run_config, make_model_config  # noqa: E402
from normlab.nn import build_model, capture  # noqa: E402
from normlab.probe import (  # noqa: E402
    angular_distance,
    depth_sweep,
    hooked,
    hooks_left,
    layer_drop,
    logit_lens,
    loglog_fit,
    merge_test,
    participation_ratio,
    probe_model,
    stream_and_grad_stats,
    stream_stats,
    t_quantile,
    text_batches,
    welch_ci,
)
from normlab.probe.interventions import drop_hooks, merge_hooks  # noqa: E402
from normlab.probe.suite import PROBES  # noqa: E402


@pytest.fixture(scope="module")
def batches():
    return text_batches(n_batches=2, batch_size=4, seq_len=32)


def make(placement="pre", n_blocks=4, d=32, seed=0, **kw):
    fields = {"placement": placement, "n_blocks": n_blocks, "d_model": d, "n_heads": 2,
              "max_seq_len": 64}
    if placement == "custom":
        fields["block_placements"] = tuple(("post", "pre", "sandwich")[i % 3]
                                           for i in range(n_blocks))
    fields.update(kw)
    return build_model(make_model_config(**fields), seed=seed)


def zero_branch(model, t):
    """Block t's attention and MLP output maps (weights and biases) set to zero: F_t = 0."""
    with torch.no_grad():
        for lin in (model.blocks[t].attn.fn.proj, model.blocks[t].mlp.fn.fc_out):
            lin.weight.zero_()
            lin.bias.zero_()
    return model


# --- measures --------------------------------------------------------------------------------

def test_angular_distance_known_values():
    a = torch.randn(3, 7, 16, generator=torch.Generator().manual_seed(0))
    assert angular_distance(a, a) == 0.0
    assert angular_distance(a, 3.0 * a) == pytest.approx(0.0, abs=1e-7)  # direction only
    assert angular_distance(a, -a) == pytest.approx(1.0, abs=1e-6)
    e = torch.eye(4)
    assert angular_distance(e[:1], e[1:2]) == pytest.approx(0.5, abs=1e-9)
    b = a + 1e-3 * torch.randn(a.shape, generator=torch.Generator().manual_seed(1))
    assert 0 < angular_distance(a, b) < 1e-3


def test_fits_and_participation_ratio():
    assert t_quantile(0.975, 1) == pytest.approx(12.7062, abs=1e-3)
    assert t_quantile(0.975, 10) == pytest.approx(2.2281, abs=1e-3)
    assert loglog_fit([(L, 5.0 * L ** -0.5, 0) for L in (4, 8, 16)])["slope"] == \
        pytest.approx(-0.5, abs=1e-12)
    noise = [0.03, -0.02, 0.01, -0.04, 0.02, 0.0, -0.01, 0.03, -0.03]
    pts = [(L, 5.0 * L ** -0.5 * math.exp(noise[3 * s + i]), s)
           for i, L in enumerate((4, 8, 16)) for s in range(3)]
    fit = loglog_fit(pts)
    assert fit["ci95_t"][0] < -0.5 < fit["ci95_t"][1]
    assert fit["ci95_t"][1] - fit["ci95_t"][0] < 0.2
    assert participation_ratio([1.0, 1.0, 1.0, 1.0]) == pytest.approx(4.0)
    assert participation_ratio([2.0, 0.0, -1.0]) == pytest.approx(1.0)  # negatives clamp to 0
    assert participation_ratio([0.0, 0.0]) == 0.0


def test_welch_interval():
    # a: mean 2.5, var 5/3; b: mean 6, var 10 -> se^2 = 5/12 + 2, Welch df = 5.5208
    w = welch_ci([1, 2, 3, 4], [2, 4, 6, 8, 10])
    se = math.sqrt(5 / 12 + 2)
    half = (w["ci95"][1] - w["ci95"][0]) / 2
    assert w["diff"] == pytest.approx(-3.5) and w["n"] == 9
    assert half == pytest.approx(t_quantile(0.975, 5.5208) * se, rel=1e-4)
    assert 2.447 * se < half < 2.571 * se  # between the t quantiles at 6 and 5 df
    assert math.isnan(welch_ci([1.0], [2.0, 3.0])["ci95"][0])


# --- stream statistics (C1, C2) -------------------------------------------------------------

@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_post_block_output_is_normalized(batches, norm):
    """After a post block the stream is what the norm makes it: token norm sqrt(d)."""
    d = 32
    res = stream_stats(make("post", n_blocks=4, d=d, norm=norm), batches)
    assert res["norm"] == pytest.approx([math.sqrt(d)] * 4, rel=1e-3)
    assert res["norm_attn"][1:] == pytest.approx([math.sqrt(d)] * 3, rel=1e-3)
    assert abs(res["growth_exponent"]) < 1e-3
    # the same numbers through the gradient pass (block outputs held instead of a second pass)
    both = stream_and_grad_stats(make("post", n_blocks=4, d=d, norm=norm), batches)
    assert both["norm"] == pytest.approx(res["norm"], rel=1e-6)
    assert both["ang_last"] == pytest.approx(res["ang_last"], abs=1e-6)
    assert both["ang_last"][-1] == 0.0


def test_pre_stream_grows_with_depth_post_does_not(batches):
    """C1 at init over 3 seeds: the pre stream norm grows along the blocks, post's is flat."""
    for seed in range(3):
        pre = stream_stats(make("pre", n_blocks=8, d=64, seed=seed), batches)
        post = stream_stats(make("post", n_blocks=8, d=64, seed=seed), batches)
        assert pre["growth_exponent"] > 0.04 and pre["norm"][-1] > 1.1 * pre["norm"][0]
        assert abs(post["growth_exponent"]) < 1e-3
        assert max(post["norm"]) / min(post["norm"]) < 1.001
    # at Xavier init (Xiong et al.'s setting, Lemma 2: ||x_l|| ~ sqrt(l)) the growth is strong
    xav = [stream_stats(make("pre", n_blocks=8, d=64, seed=s, init="xavier"), batches)
           ["growth_exponent"] for s in range(3)]
    assert 0.4 < sum(xav) / 3 < 1.0, xav


def test_identity_block_has_zero_angular_distance_and_update(batches):
    model = zero_branch(make("pre", n_blocks=4), 2)
    res = stream_stats(model, batches)
    assert res["ang_prev"][2] == 0.0 and res["rel_update"][2] == 0.0
    assert res["cos_prev"][2] == 1.0
    assert min(res["ang_prev"][:2] + res["ang_prev"][3:]) > 1e-3


# --- interventions (C3) ---------------------------------------------------------------------

@pytest.mark.parametrize("placement", ["pre", "post", "sandwich"])
def test_zero_branch_block_has_no_merge_or_drop_effect(batches, placement):
    z = 2
    model = zero_branch(make(placement, n_blocks=4), z)
    merge = merge_test(model, batches)
    drop = layer_drop(model, batches)
    # block z computes nothing, whichever input it reads (merge t = z-1) or is skipped
    assert abs(merge["merge_dloss"][z - 1]) < 1e-6 and abs(merge["merge_kl"][z - 1]) < 1e-6
    assert abs(drop["drop_dloss"][z]) < 1e-6 and abs(drop["drop_kl"][z]) < 1e-6
    # the other blocks do matter: the probe is not blind
    others = [drop["drop_kl"][t] for t in range(4) if t != z]
    assert min(others) > 1e-5, others


def test_merge_feeds_block_t_input_to_block_t_plus_1(batches):
    """The merged block t+1 computes F_{t+1}(branch input of block t), exactly."""
    model = make("pre", n_blocks=4, d=32, seed=1).eval()
    idx = batches[0][0]
    t = 1
    with torch.no_grad():
        with capture(model, "blocks.*.branch_in") as normal:
            model(idx)
        with hooked(model, merge_hooks(t)), capture(model, f"blocks.{t + 1}.attn.branch_raw") as m:
            model(idx)
        expected, _ = model.blocks[t + 1].attn.fn(normal[f"blocks.{t}.attn.branch_in"])
    torch.testing.assert_close(m[f"blocks.{t + 1}.attn.branch_raw"], expected)


def test_drop_restores_resi_dual_second_stream(batches):
    """Dropping block t of ResiDual leaves the second stream d as it was before the block."""
    model = make("resi_dual", n_blocks=4).eval()
    seen = {}

    def before(name):
        def hook(_m, args):
            seen[name] = args[1].dual.clone()
        return hook

    with torch.no_grad(), hooked(model, drop_hooks(1)), hooked(model, pre={
            "blocks.1": before("in1"), "blocks.2": before("in2")}):
        model(batches[0][0])
    torch.testing.assert_close(seen["in2"], seen["in1"], rtol=0, atol=0)


def test_logit_lens_last_block_matches_model(batches):
    res = logit_lens(make("pre", n_blocks=3), batches)
    assert res["lens_normed"][-1] == pytest.approx(res["model_loss"], abs=1e-5)
    assert "final norm" in res["lens_norm"]
    post = logit_lens(make("post", n_blocks=3), batches)
    assert "fresh LayerNorm" in post["lens_norm"]
    assert post["lens_normed"][-1] == pytest.approx(post["model_loss"], abs=1e-3)


# --- every placement, both kinds; probes never modify ---------------------------------------

@pytest.mark.parametrize("kind", ["decoder", "encoder"])
@pytest.mark.parametrize("placement", PLACEMENTS)
def test_all_probes_run_on_every_placement(placement, kind):
    L = 3
    model = make(placement, n_blocks=L, d=16, kind=kind)
    bs = text_batches(n_batches=1, batch_size=2, seq_len=8, kind=kind, n_classes=3)
    res = probe_model(model, bs, PROBES, update_steps=2, perturb_draws=1)
    pb = res["per_block"]
    for key in ("norm", "ang_prev", "ang_last", "attn_grad", "mlp_grad", "stream_grad",
                "drop_dloss", "drop_kl"):
        assert len(pb[key]) == L and all(math.isfinite(v) for v in pb[key]), key
    assert len(pb["merge_kl"]) == L - 1
    assert ("lens_normed" in pb) == (kind == "decoder")
    for key in ("last_fc_out_grad", "effective_depth", "perturb_change", "update_size_final"):
        assert math.isfinite(res["summary"][key]), key
    assert not hooks_left(model)


def test_probes_never_modify_the_model(batches):
    model = make("resi_dual", n_blocks=3, d=16)  # train mode, as built
    model.blocks[1].train(False)  # mixed flags must come back exactly
    before = {k: v.clone() for k, v in model.state_dict().items()}
    flags = [m.training for m in model.modules()]
    rng = torch.get_rng_state()
    probe_model(model, batches, PROBES, update_steps=2)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert [m.training for m in model.modules()] == flags
    assert all(p.grad is None for p in model.parameters())
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    # hooks go away after a failure inside a probe too
    too_long = [(torch.zeros(1, 80, dtype=torch.long), torch.zeros(1, 80, dtype=torch.long))]
    with pytest.raises(ValueError):
        stream_and_grad_stats(model, too_long)
    assert not hooks_left(model)


# --- depth sweep at init (C4) ---------------------------------------------------------------

def test_depth_sweep_last_layer_gradient_slopes(batches):
    """Xiong et al. 2020, Theorem 1 (Xavier init): the last MLP output weight's gradient falls
    like L^-1/2 for pre and stays about flat for post."""
    base = make_model_config(d_model=64, n_heads=2, max_seq_len=64, init="xavier")
    sweep = depth_sweep(base, ["pre", "post"], [4, 8, 16, 32], [0, 1, 2], batches,
                        probes=("grads",))
    pre = sweep["fits"]["pre"]["last_fc_out_grad"]
    post = sweep["fits"]["post"]["last_fc_out_grad"]
    assert pre["n_points"] == post["n_points"] == 12
    assert pre["slope"] < -0.25 and post["slope"] > -0.15, (pre["slope"], post["slope"])
    assert pre["ci95_t"][1] < post["ci95_t"][0]  # the intervals separate


# --- trained checkpoint and the command line ------------------------------------------------

def _app() -> typer.Typer:
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.command()(probe)

    @app.command()
    def _other() -> None:  # a second command keeps `probe` a named subcommand
        pass

    return app


def test_probe_trained_checkpoint(tmp_path):
    from normlab.train import train_run

    cfg = load_run_config(None, [
        "model.n_blocks=2", "model.d_model=32", "model.n_heads=2", "model.max_seq_len=32",
        "data.seq_len=32", "train.batch_size=4", "train.eval_batches=1", "train.steps=5",
        "train.eval_every=0", "train.device=cpu"])
    summary = train_run(cfg, tmp_path / "runs", progress=False)
    run_dir = tmp_path / "runs" / summary["run_id"]
    out = tmp_path / "out"
    r = CliRunner().invoke(_app(), ["probe", "--checkpoint", str(run_dir), "--out", str(out),
                                    "--batches", "1", "--batch-size", "2"])
    assert r.exit_code == 0, r.output
    report = json.loads((out / "probe.json").read_text())
    assert report["target"] == "checkpoint" and report["data"]["seq_len"] == 32
    res = report["runs"][0]["result"]
    assert len(res["per_block"]["drop_dloss"]) == 2 and (out / "block_norm.png").exists()
    # a run folder without its checkpoint, and a path that is not there: exit 2, named
    (run_dir / "checkpoint" / "model.safetensors").unlink()
    r = CliRunner().invoke(_app(), ["probe", "--checkpoint", str(run_dir)])
    assert r.exit_code == 2 and "model.safetensors" in r.output
    r = CliRunner().invoke(_app(), ["probe", "--checkpoint", str(tmp_path / "nope")])
    assert r.exit_code == 2 and "no such folder" in r.output
    r = CliRunner().invoke(_app(), ["probe", "--checkpoint", str(tmp_path / "runs")])
    assert r.exit_code == 2 and "not a run folder" in r.output


def test_cli_depth_sweep_writes_json_and_figures(tmp_path):
    out = tmp_path / "sweep"
    r = CliRunner().invoke(_app(), [
        "probe", "--placements", "pre,post", "--blocks", "2,4", "--seeds", "2", "--width", "16",
        "--heads", "2", "--batches", "1", "--batch-size", "2", "--seq-len", "8",
        "--probes", "stream,grads,drop", "--out", str(out)])
    assert r.exit_code == 0, r.output
    report = json.loads((out / "probe.json").read_text())
    assert len(report["runs"]) == 8
    assert set(report["fits"]) == {"pre", "post"}
    assert "last_fc_out_grad" in report["fits"]["pre"]
    assert (out / "depth_last_fc_out_grad.png").exists() and (out / "block_norm.png").exists()
    assert "log-log slope" in r.output


def test_a_stopped_depth_sweep_finishes_only_what_was_left(tmp_path, monkeypatch):
    """Each model's result is kept in OUT/parts as it finishes; a re-run with the same options
    reads those and probes only the models that are missing, saying so, and reports the same
    numbers; other options probe anew."""
    import normlab.probe.sweep as sweep

    out = tmp_path / "sweep"
    args = ["probe", "--placements", "pre,post", "--blocks", "2,3", "--width", "16", "--heads",
            "2", "--batches", "1", "--batch-size", "2", "--seq-len", "8", "--probes", "stream",
            "--no-figures", "--out", str(out)]
    first = CliRunner().invoke(_app(), args)
    assert first.exit_code == 0, first.output
    assert "probing pre L=2 seed=0 (1/4) ..." in first.output
    parts = sorted((out / "parts").glob("*.json"))
    assert len(parts) == 4 and parts[0].name.startswith("post-L2-s0-")
    before = json.loads((out / "probe.json").read_text())
    for part in parts[:2]:  # as if stopped after two models
        part.unlink()
    probed = []
    real = sweep.probe_model
    monkeypatch.setattr(sweep, "probe_model",
                        lambda model, *a, **k: probed.append(model.cfg.placement) or
                        real(model, *a, **k))
    again = CliRunner().invoke(_app(), args)
    assert again.exit_code == 0, again.output
    assert probed == ["post", "post"]  # the two left
    assert "probing pre L=2 seed=0 (1/4): already probed" in again.output
    after = json.loads((out / "probe.json").read_text())
    assert after["runs"] == before["runs"] and after["fits"] == before["fits"]
    other = CliRunner().invoke(_app(), [*args[:-2], "--batch-size", "3", "--out", str(out)])
    assert other.exit_code == 0 and len(probed) == 6  # other inputs: every model anew

    def stop(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(sweep, "probe_model", stop)
    (out / "parts" / parts[0].name).unlink(missing_ok=True)
    stopped = CliRunner().invoke(_app(), args)
    assert stopped.exit_code == 130
    assert f"stopped; 7 model(s) kept in {out / 'parts'}: the same command probes only the " \
        "rest" in " ".join(stopped.output.split())


@pytest.mark.parametrize("args, message", [
    (["--placement", "prenorm"], "not a placement"),
    (["--blocks", "6,x"], "--blocks"),
    (["--probes", "stream,bogus"], "unknown probe"),
    (["--text", "/no/such/file.txt"], "no such file"),
    (["--seq-len", "512", "--set", "max_seq_len=64"], "--seq-len"),
    (["--set", "n_heads=3", "--width", "16"], "n_heads"),
    (["--checkpoint", ".", "--placement", "pre"], "drop --placement"),
    (["--hf", "minilm", "--placement", "pre", "--seeds", "2"], "--placement, --seeds choose"),
])
def test_cli_bad_input_exits_2(tmp_path, args, message):
    r = CliRunner().invoke(_app(), ["probe", *args, "--out", str(tmp_path / "o")])
    assert r.exit_code == 2, r.output
    assert message in r.output
    assert not (tmp_path / "o" / "probe.json").exists()
