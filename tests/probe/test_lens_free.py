"""`lens_free` (C13): the LM head read at each block's stream through a norm without parameters,
checked against the same reading computed here from each block's captured output stream."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from normlab.config import make_model_config  # noqa: E402
from normlab.nn import build_model  # noqa: E402
from normlab.probe import logit_lens, text_batches  # noqa: E402


@pytest.fixture(scope="module")
def batches():
    return text_batches(n_batches=2, batch_size=3, seq_len=24)


def _model(placement: str, norm: str = "layernorm", n_blocks: int = 3):
    cfg = make_model_config(placement=placement, n_blocks=n_blocks, d_model=32, n_heads=2,
                            max_seq_len=64, norm=norm)
    model = build_model(cfg, seed=3)
    # a final norm with a gain and bias of its own, so "through the final norm" and "through
    # a norm without parameters" read differently
    if model.plan.final_norm is not None:
        with torch.no_grad():
            g = torch.Generator().manual_seed(0)
            fn = model.final.norm
            fn.weight.copy_(0.5 + torch.rand(fn.weight.shape, generator=g))
            if getattr(fn, "bias", None) is not None:
                fn.bias.copy_(0.3 * torch.randn(fn.bias.shape, generator=g))
    return model


def _by_hand(model, batches, norm) -> list[float]:
    """Per block, the mean over batches of the next-token loss of head(norm(block output))."""
    L = len(model.blocks)
    out = [0.0] * L
    model.eval()
    with torch.no_grad():
        for idx, targets in batches:
            streams: dict[int, torch.Tensor] = {}
            handles = [model.blocks[i].register_forward_hook(
                lambda _m, _a, o, i=i, seen=streams: seen.__setitem__(i, o[0]))
                for i in range(L)]
            try:
                model(idx, targets)
            finally:
                for h in handles:
                    h.remove()
            for i in range(L):
                logits = model.lm_head(norm(streams[i]))
                out[i] += F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                                          targets.reshape(-1)).item() / len(batches)
    return out


@pytest.mark.parametrize(("placement", "norm", "free"), [
    ("pre", "layernorm", lambda x: F.layer_norm(x, (32,), eps=1e-5)),
    ("pre", "rmsnorm",
     lambda x: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)),
    ("post", "layernorm", lambda x: F.layer_norm(x, (32,), eps=1e-5))])
def test_lens_free_is_the_head_on_the_stream_normalized_without_parameters(
        placement, norm, free, batches):
    model = _model(placement, norm)
    res = logit_lens(model, batches)
    assert res["lens_free"] == pytest.approx(_by_hand(model, batches, free), abs=1e-4)
    assert res["lens_raw"] == pytest.approx(_by_hand(model, batches, lambda x: x), abs=1e-4)


def test_lens_free_differs_from_the_trained_final_norm_and_equals_post_s_fresh_norm(batches):
    """Under pre the final norm has a gain and bias of its own: the two normed readings differ;
    post has no final norm, so `lens_normed` is itself a norm without parameters and equals
    `lens_free`."""
    pre = logit_lens(_model("pre"), batches)
    assert max(abs(a - b) for a, b in zip(pre["lens_free"], pre["lens_normed"],
                                          strict=True)) > 1e-3
    post = logit_lens(_model("post"), batches)
    assert post["lens_free"] == pytest.approx(post["lens_normed"], abs=1e-6)


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_lens_normed_recomputes_the_final_norms_statistics_at_every_block(norm, batches):
    """`lens_normed` is the final norm applied afresh to each block's stream: with that block's
    own mean and variance (or RMS), computed here by `F.layer_norm` / `F.rms_norm` with the final
    norm's gain and bias; the reading with the statistics of the last block's stream frozen
    differs from it."""
    model = _model("pre", norm)
    with torch.no_grad():  # a last block that writes a lot: its stream's scale is not the others'
        model.blocks[-1].mlp.fn.fc_out.weight.mul_(50.0)
    fn = model.final.norm
    bias = getattr(fn, "bias", None)
    if norm == "layernorm":
        def fresh(x):
            return F.layer_norm(x, (32,), fn.weight, bias, eps=1e-5)
    else:
        def fresh(x):
            return F.rms_norm(x, (32,), fn.weight, eps=1e-5)
    res = logit_lens(model, batches)
    assert res["lens_normed"] == pytest.approx(_by_hand(model, batches, fresh), abs=1e-4)
    # the last block's per-token statistics applied to every block's stream
    last: dict[str, torch.Tensor] = {}
    handle = model.blocks[-1].register_forward_hook(
        lambda _m, _a, o: last.__setitem__("x", o[0]))
    frozen = []
    for idx, targets in batches:
        with torch.no_grad():
            model(idx, targets)
        xl = last["x"]
        if norm == "layernorm":
            scale = torch.rsqrt(xl.var(-1, keepdim=True, unbiased=False) + 1e-5)
            frozen.append(lambda x, s=scale: ((x - x.mean(-1, keepdim=True)) * s) * fn.weight
                          + bias)
        else:
            scale = torch.rsqrt(xl.pow(2).mean(-1, keepdim=True) + 1e-5)
            frozen.append(lambda x, s=scale: x * s * fn.weight)
    handle.remove()
    by_frozen = [sum(_by_hand(model, [b], f)[i] for b, f in zip(batches, frozen, strict=True))
                 / len(batches) for i in range(len(model.blocks))]
    assert by_frozen[-1] == pytest.approx(res["lens_normed"][-1], abs=1e-4)
    assert max(abs(a - b) for a, b in zip(by_frozen[:-1], res["lens_normed"][:-1],
                                          strict=True)) > 1e-3
