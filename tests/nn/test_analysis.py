"""Norm-level analysis: the norm and attention taps, and the cache's residual-stream methods
(accumulated_resid, decompose_resid, apply_ln_to_stack, logit_attrs), checked against values
computed independently (float64, plain softmax, the model's own logits)."""

import math
import re
from pathlib import Path

import pytest
import torch

from normlab.config import ModelConfig
from normlab.nn import build_model, capture, tap_names
from normlab.nn import layers as layers_mod
from normlab.nn import norms as norms_mod
from normlab.nn.layers import apply_rope

SMALL = dict(n_blocks=3, d_model=32, n_heads=2, max_seq_len=16)


def _model(**fields):
    model = build_model(ModelConfig(**{**SMALL, **fields}), seed=0).eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # norm gains and biases away from 1 and 0, so a dropped one shows
        for name, p in model.named_parameters():
            if "norm" in name and p.ndim == 1:
                p.add_(torch.randn(p.shape, generator=gen) * 0.3)
    return model


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))


def _logit_of(logits, tokens):
    return logits.gather(-1, tokens[..., None])[..., 0]


# --- taps -------------------------------------------------------------------------------------

@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_scale_tap_is_one_over_std_or_rms_in_float64(norm, tokens):
    model = _model(placement="pre", norm=norm)
    eps = model.cfg.norm_eps
    plain = model(tokens).logits
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens)
    names = [n[: -len(".scale")] for n in cache if n.endswith(".scale")]
    assert names == [f"blocks.{i}.{k}.in_norm" for i in range(3) for k in ("attn", "mlp")] + [
        "final.norm"]
    for name in names:
        x = cache[f"{name}.input"].double()
        if norm == "layernorm":
            expected = 1 / torch.sqrt(((x - x.mean(-1, keepdim=True)) ** 2).mean(-1, True) + eps)
        else:
            expected = 1 / torch.sqrt((x**2).mean(-1, keepdim=True) + eps)
        scale = cache[f"{name}.scale"]
        assert scale.shape == (2, 16, 1)
        torch.testing.assert_close(scale.double(), expected, rtol=1e-6, atol=0)
        module = model.get_submodule(name)
        torch.testing.assert_close(cache[f"{name}.out"], module(cache[f"{name}.input"]))
    assert torch.equal(cache["blocks.1.attn.in_norm.out"], cache["blocks.1.attn.branch_in"])
    # the explicit computation (scale hooked) is the fused one's function
    torch.testing.assert_close(logits, plain, rtol=0, atol=1e-5)


def test_a_hook_on_the_scale_replaces_it(tokens):
    model = _model(placement="pre")
    _, cache = model.run_with_cache(tokens, names_filter=["final.norm.scale", "final.input"])
    doubled = model.run_with_hooks(tokens, fwd_hooks=[("final.norm.scale",
                                                       lambda s, hook: 2 * s)])
    norm = model.final.norm
    x = cache["final.input"]
    by_hand = (x - x.mean(-1, keepdim=True)) * 2 * cache["final.norm.scale"] * norm.weight
    torch.testing.assert_close(doubled, model.lm_head(by_hand + norm.bias), atol=1e-5, rtol=0)


def test_dyt_has_no_scale_tap(tokens):
    model = _model(placement="pre", norm="dyt")
    names = tap_names(model)
    assert "final.norm.input" in names and "final.norm.out" in names
    assert not any(n.endswith(".scale") for n in names)
    _, cache = model.run_with_cache(tokens)
    with pytest.raises(ValueError, match="DyT.*no per-token scale.*freeze_scale=False"):
        cache.apply_ln_to_stack(cache.accumulated_resid())
    applied = cache.accumulated_resid(apply_ln=True, freeze_scale=False)
    torch.testing.assert_close(applied[-1], cache["final.out"])


@pytest.mark.parametrize("positions", ["learned", "rope"])
def test_pattern_tap_is_the_plain_softmax_of_the_q_and_k_taps(positions, tokens):
    model = _model(placement="pre", positions=positions)
    _, cache = model.run_with_cache(tokens, names_filter=["blocks.*.attn.fn.*",
                                                          "blocks.*.attn.branch_in"])
    for i in range(3):
        attn = model.blocks[i].attn.fn
        q, k = cache[f"blocks.{i}.attn.fn.q"], cache[f"blocks.{i}.attn.fn.k"]
        # q and k are after RoPE: recompute them from the branch input
        qkv = attn.qkv(cache[f"blocks.{i}.attn.branch_in"]).view(2, 16, 3, 2, 16)
        q_raw, k_raw = (t.transpose(1, 2) for t in qkv.unbind(2)[:2])
        if positions == "rope":
            q_raw = apply_rope(q_raw, model.rope_cos[:16], model.rope_sin[:16])
            k_raw = apply_rope(k_raw, model.rope_cos[:16], model.rope_sin[:16])
        torch.testing.assert_close(q, q_raw)
        torch.testing.assert_close(k, k_raw)
        pattern = cache[f"blocks.{i}.attn.fn.pattern"]
        assert pattern.shape == (2, 2, 16, 16)
        scores = q.double() @ k.double().transpose(-1, -2) / math.sqrt(16)
        scores = scores.masked_fill(torch.ones(16, 16, dtype=torch.bool).triu(1), -math.inf)
        torch.testing.assert_close(pattern.double(), scores.softmax(-1), rtol=0, atol=1e-6)
        torch.testing.assert_close(pattern.sum(-1), torch.ones(2, 2, 16))
        assert torch.all(pattern.triu(1) == 0)


def test_qkv_taps_are_after_the_qkv_norm(tokens):
    model = _model(placement="hybrid", positions="rope")
    _, cache = model.run_with_cache(tokens, names_filter=["blocks.1.attn.fn.*",
                                                          "blocks.1.attn.branch_in"])
    attn = model.blocks[1].attn.fn
    v = attn.qkv(cache["blocks.1.attn.branch_in"]).view(2, 16, 3, 2, 16)[:, :, 2]
    torch.testing.assert_close(cache["blocks.1.attn.fn.v"], attn.qkv_norms[2](v).transpose(1, 2))


def test_unhooked_taps_cost_nothing(monkeypatch, tokens):
    """Without the pattern or a scale tap hooked, the fused attention and norm kernels run and
    no norm or attention tap module is called."""
    model = _model(placement="pre")

    def explicit(*_a, **_k):
        raise AssertionError("explicit attention taken")

    def scale(*_a, **_k):
        raise AssertionError("scale computed")

    called = []
    monkeypatch.setattr(layers_mod.Attention, "_explicit", explicit)
    monkeypatch.setattr(norms_mod, "layernorm_scale", scale)
    with monkeypatch.context() as m:
        m.setattr(norms_mod.Tap, "__call__", lambda self, x: called.append(self) or x)
        model(tokens)
    name = {id(m): n for n, m in model.named_modules()}
    called = {name[id(t)] for t in called}
    assert "blocks.0.attn.branch_in" in called  # the sublayer taps are called, those below not
    assert not [n for n in called if re.search(r"norm\.|\.fn\.", n)]
    with capture(model, "blocks.*.mlp.stream_out"):
        model(tokens)
    monkeypatch.undo()
    with capture(model, "blocks.0.attn.fn.pattern") as cap:
        model(tokens)
    assert cap["blocks.0.attn.fn.pattern"].shape == (2, 2, 16, 16)


def test_capture_is_a_mapping(tokens):
    model = _model(placement="pre")
    with capture(model, "blocks.*.mlp.stream_out") as cap:
        model(tokens)
    assert list(cap.keys()) == [f"blocks.{i}.mlp.stream_out" for i in range(3)]
    assert dict(cap.items()).keys() == cap.keys() and len(cap) == 3
    assert "final.out" not in cap


# --- the residual stream ----------------------------------------------------------------------

def test_accumulated_resid_follows_transformerlens_layout(tokens):
    model = _model(placement="pre")
    _, cache = model.run_with_cache(tokens)
    stack, labels = cache.accumulated_resid(return_labels=True)
    assert labels == ["0_pre", "1_pre", "2_pre", "final_post"]
    assert torch.equal(stack[1], cache["blocks.1.attn.stream_in"])
    assert torch.equal(stack[-1], cache["final.input"])
    _, labels = cache.accumulated_resid(layer=2, incl_mid=True, return_labels=True)
    assert labels == ["0_pre", "0_mid", "1_pre", "1_mid", "2_pre"]
    stack, labels = cache.accumulated_resid(layer=1, mlp_input=True, return_labels=True)
    assert labels == ["0_pre", "0_mid", "1_pre", "1_mid"]
    assert torch.equal(stack[-1], cache["blocks.1.mlp.stream_in"])
    # apply_ln at a block: the block's own input norm with its cached scale
    lensed = cache.accumulated_resid(layer=1, apply_ln=True)
    torch.testing.assert_close(lensed[-1], cache["blocks.1.attn.in_norm.out"])
    lensed = cache.accumulated_resid(layer=1, mlp_input=True, apply_ln=True)
    torch.testing.assert_close(lensed[-1], cache["blocks.1.mlp.in_norm.out"])
    with pytest.raises(ValueError, match=r"layer=7 is out of range; use 0\.\.3"):
        cache.accumulated_resid(layer=7)
    _, part = model.run_with_cache(tokens, names_filter="blocks.*.mlp.stream_out")
    with pytest.raises(KeyError, match="blocks.0.attn.stream_in"):
        part.accumulated_resid()


@pytest.mark.parametrize("placement, extra", [
    ("pre", {}), ("pre", {"norm": "rmsnorm"}), ("peri", {}), ("rezero", {"gate_init": 0.3}),
    ("lns", {}), ("hybrid_star", {"n_blocks": 1}),
])
def test_decompose_resid_sums_to_the_stream_exactly(placement, extra, tokens):
    model = _model(placement=placement, **extra)
    _, cache = model.run_with_cache(tokens)
    L = model.cfg.n_blocks
    stack, labels = cache.decompose_resid(return_labels=True)
    assert labels == ["embed"] + [f"{i}_{k}_out" for i in range(L) for k in ("attn", "mlp")]
    total = stack[0]
    for part in stack[1:]:  # in the order the model added them: bit for bit
        total = total + part
    assert torch.equal(total, cache["final.input"])
    torch.testing.assert_close(stack.sum(0), cache["final.input"])
    upto = cache.decompose_resid(layer=L - 1, mlp_input=True)
    torch.testing.assert_close(upto.sum(0), cache[f"blocks.{L - 1}.mlp.stream_in"])
    _, labels = cache.decompose_resid(mode="mlp", incl_embeds=False, return_labels=True)
    assert labels == [f"{i}_mlp_out" for i in range(L)]


@pytest.mark.parametrize("placement, why", [
    ("post", r"blocks\.0\.attn \(post\) re-normalizes the stream after its add"),
    ("deepnorm", r"blocks\.0\.attn \(deepnorm\) re-normalizes"),
    ("hybrid", r"blocks\.0\.mlp \(hybrid\) takes its skip after"),
    ("resi_dual", "ResiDual's head reads a \\+ Norm\\(d\\), two streams"),
    ("mix", r"blocks\.0\.attn \(post\)"),
])
def test_decompose_resid_refuses_renormalized_streams(placement, why, tokens):
    extra = {"mix_switch": 1} if placement == "mix" else {}
    _, cache = _model(placement=placement, **extra).run_with_cache(tokens)
    with pytest.raises(ValueError, match=f"decompose_resid: {why}"):
        cache.decompose_resid()
    assert cache.accumulated_resid().shape == (4, 2, 16, 32)  # the streams themselves are fine


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_frozen_final_norm_is_linear_and_reproduces_the_norm(norm, tokens):
    model = _model(placement="pre", norm=norm)
    _, cache = model.run_with_cache(tokens)
    full = cache.accumulated_resid(apply_ln=True)[-1]
    torch.testing.assert_close(full, cache["final.out"], rtol=0, atol=1e-5)
    parts = cache.decompose_resid(apply_ln=True)
    bias = model.final.norm.bias if norm == "layernorm" else 0
    torch.testing.assert_close(parts.sum(0) + bias, cache["final.out"], rtol=0, atol=1e-5)
    # a scale recomputed per component is not the norm of the sum
    recomputed = cache.apply_ln_to_stack(cache.decompose_resid(), freeze_scale=False,
                                         add_bias=False)
    assert not torch.allclose(recomputed.sum(0) + bias, cache["final.out"], atol=1e-2)
    # on whole streams the recomputed scale is the cached one
    torch.testing.assert_close(cache.apply_ln_to_stack(cache.accumulated_resid(),
                                                       freeze_scale=False)[-1],
                               cache["final.out"], rtol=0, atol=1e-5)


def test_no_final_norm_reads_the_stream_as_it_is(tokens):
    model = _model(placement="post")
    _, cache = model.run_with_cache(tokens)
    stack = cache.accumulated_resid()
    assert torch.equal(cache.apply_ln_to_stack(stack), stack)


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_logit_attrs_sum_to_the_logit(norm, tokens):
    model = _model(placement="pre", norm=norm)
    logits, cache = model.run_with_cache(tokens)
    stack = cache.decompose_resid()
    target = torch.roll(tokens, -1, dims=1)
    attrs = cache.logit_attrs(stack, target)
    assert attrs.shape == (7, 2, 16)
    torch.testing.assert_close(attrs.sum(0) + cache.logit_bias(target), _logit_of(logits, target),
                               rtol=0, atol=1e-5)
    # one token id, and a logit difference
    one = cache.logit_attrs(stack, 65)
    torch.testing.assert_close(one.sum(0) + cache.logit_bias(65), logits[..., 65],
                               rtol=0, atol=1e-5)
    diff = cache.logit_attrs(stack, 65, incorrect_tokens=66)
    torch.testing.assert_close(diff.sum(0) + cache.logit_bias(65, 66),
                               logits[..., 65] - logits[..., 66], rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match=r"\[batch, pos\] tensor"):
        cache.logit_attrs(stack, target[0])


def test_logit_attrs_needs_a_decoder(tokens):
    model = _model(placement="pre", kind="encoder", n_classes=2)
    _, cache = model.run_with_cache(tokens)
    with pytest.raises(ValueError, match="needs a decoder's LM head"):
        cache.logit_attrs(cache.decompose_resid(), 1)


# --- the worked example in docs/analysis.md ---------------------------------------------------

def test_the_worked_example_in_the_docs_runs_and_prints_what_the_docs_show(capsys):
    """The snippet asserts that the attributions sum to the logit; this checks its table."""
    doc = (Path(__file__).parents[2] / "docs" / "analysis.md").read_text()
    doc = doc.split("## Worked example", 1)[1]
    code = re.search(r"```python\n(.*?)```", doc, re.S).group(1)
    shown = re.search(r"```text\n(.*?)```", doc, re.S).group(1)
    exec(compile(code, "docs/analysis.md", "exec"), {})
    printed = capsys.readouterr().out
    number = r"-?\d+\.\d+"
    # the same table; numbers as shown up to another CPU's rounding through 300 training steps:
    # the page's table came from an AMD EPYC; an Intel Xeon (AVX-512) gives block 2's logit 0.40
    # or 0.41 for 0.35 and its share 9.2% for 7.9% (the exact split itself is asserted in the
    # snippet), so each number is checked to 20% or 0.1
    assert re.sub(number, "#", printed) == re.sub(number, "#", shown)
    for got, want in zip(re.findall(number, printed), re.findall(number, shown), strict=True):
        assert math.isclose(float(got), float(want), rel_tol=0.2, abs_tol=0.1), (got, want)
