"""The TransformerLens-style API: run_with_cache, ActivationCache, run_with_hooks; print(plan)."""

import pytest
import torch

from normlab.config import ModelConfig
from normlab.nn import ActivationCache, build_model, capture, tap_names
from normlab.nn.plan import build_plan
from normlab.probe import hooks_left

CFG = ModelConfig(placement="post", n_blocks=3, d_model=32, n_heads=2, max_seq_len=16)


@pytest.fixture(scope="module")
def model():
    return build_model(CFG, seed=0).eval()


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))


def test_run_with_cache_returns_logits_and_the_selected_taps(model, tokens):
    logits, cache = model.run_with_cache(tokens, names_filter="blocks.*.mlp.stream_out")
    assert torch.equal(logits, model(tokens).logits)
    assert list(cache.keys()) == [f"blocks.{i}.mlp.stream_out" for i in range(3)]
    with capture(model, "blocks.*.mlp.stream_out") as cap:
        model(tokens)
    for name, value in cache.items():
        assert torch.equal(value, cap[name])
    assert torch.equal(cache["mlp.stream_out", 1], cache["blocks.1.mlp.stream_out"])
    assert torch.equal(cache["mlp.stream_out", -1], cache["blocks.2.mlp.stream_out"])
    assert "blocks.0.attn.stream_in" not in cache and len(cache) == 3
    with pytest.raises(KeyError, match="not in the cache"):
        cache["final.out"]


@pytest.mark.parametrize("names_filter, expected", [
    (None, None),
    ("final.out", ["final.out"]),
    (["final.input", "blocks.0.attn.branch_in"], ["blocks.0.attn.branch_in", "final.input"]),
    (lambda name: name.endswith("branch_raw") and name.startswith("blocks.2"),
     ["blocks.2.attn.branch_raw", "blocks.2.mlp.branch_raw"]),
])
def test_names_filter_forms(model, tokens, names_filter, expected):
    _, cache = model.run_with_cache(tokens, names_filter=names_filter)
    assert sorted(cache) == sorted(expected if expected is not None else tap_names(model))


def test_the_former_tap_name_in_still_reads(model, tokens):
    """`final.in` and `{norm}.in` were renamed `input` (`in` is a Python keyword); names saved
    before, or written in scripts, still select, hook and read the same taps."""
    assert "final.in" not in tap_names(model) and "final.input" in tap_names(model)
    _, cache = model.run_with_cache(tokens, tokens, names_filter=["final.in", "*.post_norm.in"],
                                    incl_bwd=True)
    model.zero_grad(set_to_none=True)
    norms = [f"blocks.{i}.{k}.post_norm.input" for i in range(3) for k in ("attn", "mlp")]
    assert sorted(cache) == sorted(n + g for n in ["final.input", *norms] for g in ("", "_grad"))
    assert torch.equal(cache["final.in"], cache["final.input"])
    assert torch.equal(cache["final.in_grad"], cache["final.input_grad"])
    assert torch.equal(cache["attn.post_norm.in", 1], cache["blocks.1.attn.post_norm.input"])
    assert torch.equal(cache.stack("mlp.post_norm.in"), cache.stack("mlp.post_norm.input"))
    with capture(model, "final.in") as cap:
        model(tokens)
    assert list(cap) == ["final.input"] and torch.equal(cap["final.in"], cache["final.input"])
    seen = []
    model.run_with_hooks(tokens, fwd_hooks=[("final.in", lambda v, hook: seen.append(hook.name))])
    assert seen == ["final.input"]


def test_names_filter_that_selects_nothing_is_an_error(model, tokens):
    with pytest.raises(ValueError, match="no tap matches"):
        model.run_with_cache(tokens, names_filter="blocks.*.resid_post")
    with pytest.raises(ValueError, match="accepts no tap"):
        model.run_with_cache(tokens, names_filter=lambda name: False)


def test_stack_across_blocks(model, tokens):
    _, cache = model.run_with_cache(tokens, names_filter="blocks.*.mlp.stream_out")
    stacked = cache.stack("mlp.stream_out")
    assert stacked.shape == (3, 2, 16, 32)
    for i in range(3):
        assert torch.equal(stacked[i], cache[f"blocks.{i}.mlp.stream_out"])
    with pytest.raises(KeyError, match="no block has 'attn.stream_out'"):
        cache.stack("attn.stream_out")
    _, part = model.run_with_cache(tokens, names_filter=["blocks.0.mlp.stream_out",
                                                         "blocks.2.mlp.stream_out"])
    with pytest.raises(KeyError, match=r"blocks \[0, 2\] of 3"):
        part.stack("mlp.stream_out")


def test_incl_bwd_caches_gradients(tokens):
    model = build_model(CFG, seed=0)
    loss, cache = model.run_with_cache(tokens, tokens, names_filter="blocks.*.mlp.stream_out",
                                       incl_bwd=True, return_type="loss")
    assert loss.ndim == 0
    with capture(model, "blocks.*.mlp.stream_out", grads=True) as cap:
        model(tokens, tokens).loss.backward()
    grads = cache.stack("mlp.stream_out_grad")
    assert grads.shape == (3, 2, 16, 32) and grads.abs().sum() > 0
    for i in range(3):
        assert torch.allclose(grads[i], cap.grads[f"blocks.{i}.mlp.stream_out"])
    with pytest.raises(ValueError, match="pass targets"):
        model.run_with_cache(tokens, incl_bwd=True)
    with pytest.raises(ValueError, match="needs targets"):
        model.run_with_cache(tokens, return_type="loss")


def test_run_with_hooks_replaces_values_like_transformerlens(model, tokens):
    seen = []

    def ablate(value, hook):
        seen.append((hook.name, hook.layer(), tuple(value.shape)))
        return torch.zeros_like(value)

    hooked = model.run_with_hooks(tokens, fwd_hooks=[("blocks.1.mlp.branch_added", ablate)])
    assert seen == [("blocks.1.mlp.branch_added", 1, (2, 16, 32))]
    # the same ablation by hand: the stream after block 1's MLP is the stream before it (post-LN
    # then normalizes it)
    _, cache = model.run_with_cache(tokens, names_filter="blocks.1.mlp.stream_in")
    stream_in = cache["blocks.1.mlp.stream_in"]
    _, hooked_cache = model.run_with_cache(tokens, names_filter="blocks.1.mlp.stream_out")
    with model.hooks([("blocks.1.mlp.branch_added", lambda v, hook: torch.zeros_like(v))]):
        _, ablated = model.run_with_cache(tokens, names_filter="blocks.1.mlp.stream_out")
    norm = model.blocks[1].mlp.post_norm
    assert torch.allclose(ablated["blocks.1.mlp.stream_out"], norm(stream_in), atol=1e-6)
    assert not torch.allclose(ablated["blocks.1.mlp.stream_out"],
                              hooked_cache["blocks.1.mlp.stream_out"])
    assert not torch.allclose(hooked, model(tokens).logits)
    assert hooks_left(model) == []


def test_hooks_that_observe_chain_and_clean_up(model, tokens):
    names = []
    observed = model.run_with_hooks(tokens, fwd_hooks=[
        (lambda name: name.endswith("attn.stream_in"), lambda v, hook: names.append(hook.name))])
    assert names == [f"blocks.{i}.attn.stream_in" for i in range(3)]
    assert torch.equal(observed, model(tokens).logits)  # returning None keeps the value
    doubled = model.run_with_hooks(tokens, fwd_hooks=[
        ("final.out", lambda v, hook: v * 2), ("final.out", lambda v, hook: v + 1)])
    with capture(model, "final.out") as cap:
        model(tokens)
    assert torch.allclose(doubled, model.lm_head(cap["final.out"] * 2 + 1), atol=1e-5)

    def broken(value, hook):
        raise RuntimeError("hook failed")

    with pytest.raises(RuntimeError, match="hook failed"):
        model.run_with_hooks(tokens, fwd_hooks=[("final.input", broken)])
    assert hooks_left(model) == []
    with pytest.raises(TypeError, match="not callable"):
        model.run_with_hooks(tokens, fwd_hooks=[("final.input", None)])


def test_return_types(model, tokens):
    both = model.run_with_hooks(tokens, tokens, return_type="both")
    assert torch.equal(both.logits, model(tokens).logits) and both.loss.ndim == 0
    assert model.run_with_hooks(tokens, return_type=None) is None
    with pytest.raises(ValueError, match="return_type"):
        model.run_with_hooks(tokens, return_type="probs")


def test_cache_is_a_mapping():
    cache = ActivationCache({"blocks.0.mlp.stream_out": torch.ones(2)}, n_blocks=1)
    assert dict(cache) == {"blocks.0.mlp.stream_out": cache["blocks.0.mlp.stream_out"]}
    assert "1 tensors" in repr(cache)


def test_print_plan_is_describe(capsys):
    plan = build_plan(ModelConfig(placement="deepnorm", n_blocks=2))
    print(plan)
    out = capsys.readouterr().out
    assert out == plan.describe() + "\n"
    assert "x = LN(" in out and "constants: deepnorm_alpha=" in out


def test_select_taps_takes_exact_names_and_globs_alike_and_names_what_matched_nothing(model):
    from normlab.nn.taps import select_taps, tap_names

    names = tap_names(model)
    exact = ["blocks.2.mlp.stream_out", "final.input", "blocks.0.attn.stream_in"]
    assert select_taps(model, exact) == [n for n in names if n in exact]  # the model's order
    assert select_taps(model, ["blocks.?.mlp.stream_out", "final.input"]) == [
        n for n in names if n == "final.input" or (n.startswith("blocks.")
                                                   and n.endswith(".mlp.stream_out"))]
    assert select_taps(model, "blocks.[01].attn.stream_in") == [
        "blocks.0.attn.stream_in", "blocks.1.attn.stream_in"]
    assert select_taps(model, ["final.in"]) == ["final.input"]  # a former name
    for missing in (["final.input", "blocks.9.mlp.stream_out"],
                    ["final.input", "blocks.*.nothing"], ["blocks.[7].mlp.stream_out"]):
        with pytest.raises(ValueError, match=r"no tap matches \['" + missing[-1].replace(
                "[", r"\[").replace("]", r"\]").replace("*", r"\*").replace(".", r"\.")):
            select_taps(model, missing)
    # a name that matches nothing is named alone, not the ones that matched
    with pytest.raises(ValueError, match=r"no tap matches \['blocks\.9\.mlp\.stream_out'\];"):
        select_taps(model, ["final.input", "blocks.9.mlp.stream_out"])
