"""normlab's tap names on a Hugging Face model: probe real checkpoints with normlab's probes.

`HFTapModel(hf_model)` wraps a `transformers` model of a known family and exposes the interface
the probes read from a normlab model: `blocks[i].{attn,mlp}.{stream_in, branch_in, branch_raw,
branch_added, stream_out}`, `blocks[i]` itself, `final.input` / `final.out` (all identity `Tap`
modules), `stream(idx, attention_mask)`, `forward(idx, targets)` (models with an LM head),
`cfg.kind` and `plan.dual_stream`. So `normlab.nn.capture(wrapper, "blocks.*.mlp.stream_out")`,
`normlab.probe.stream_stats(wrapper, batches)` and, for causal LMs,
`normlab.probe.layer_drop(wrapper, batches)` run unchanged on a real checkpoint.

How: during each forward of the wrapper, forward (pre-)hooks on the Hugging Face modules pass the
value at each site through the matching `Tap`; hooks attached to the tap observe it, and a tap
hook that returns a new tensor replaces the value where the site allows it (see `SITES`). The
bridge hooks are removed after every forward; the Hugging Face model is never modified, and with
no hook on any tap nothing but the bridge's own bookkeeping runs.

Which module carries each tap (per block, relative to the layer; "in" = the module's input):

| tap | BERT (post-LN) | GPT-2 (pre-LN) | Llama family (pre-RMSNorm) |
|---|---|---|---|
| attn.stream_in | layer in | layer in | layer in |
| attn.branch_in | attention.self in | ln_1 out | input_layernorm out |
| attn.branch_raw, .branch_added | attention.output.dense out | attn out | self_attn out |
| attn.stream_out, mlp.stream_in | attention out | ln_2 in (ro) | post_attention_layernorm in (ro) |
| mlp.branch_in | intermediate in | ln_2 out | post_attention_layernorm out |
| mlp.branch_raw, .branch_added | output.dense out | mlp out | mlp out |
| mlp.stream_out | layer out | layer out | layer out |
| final.input / final.out | last layer out (no final norm) | ln_f in / out | norm in / out |
| attn.post_norm.* / .in_norm.* | attention.output.LayerNorm | ln_1 | input_layernorm |
| mlp.post_norm.* / .in_norm.* | output.LayerNorm | ln_2 | post_attention_layernorm |
| final.norm.* | - | ln_f | norm |
| attn.fn.q, .k, .v | attention.self.{query,key,value} | c_attn out / 3 | self_attn.{q,k,v}_proj |
| attn.fn.pattern | attention.self out[1] | attn out[1] | self_attn out[1] |

(ro: read-only, the residual add happens inside the layer's forward.)

The attention taps are read-only. `attn.fn.{q,k,v}` are `[B, heads, T, head_dim]`, the tensors
the attention's score and weighted sum are computed from, as on normlab's attention: on the
Llama family q and k are rotated with the `position_embeddings` (cos, sin) the layer receives
(after Qwen3's per-head `q_norm` / `k_norm`), and k and v have `num_key_value_heads` heads (each
serves `num_attention_heads / num_key_value_heads` query heads, grouped-query attention); GPT-2
and BERT have no QKV norm and no RoPE. `attn.fn.pattern` is the softmax weights `[B, heads, T,
T]` (causal on the decoders, the padding mask on BERT; after attention dropout, a no-op in eval
mode): while it is hooked that forward runs transformers' eager attention (sdpa returns no
weights) and the model's attention implementation is restored afterwards; with it unhooked
nothing changes. Layouts are those of transformers 5.

Each norm carries normlab's norm taps (`normlab.nn.norms`): `.input` (the norm module's input),
`.scale` (1/std or 1/rms per token, [B, T, 1], computed from the input with the module's own eps
only while hooked; a hook returning a new scale makes the norm's output be recomputed with it)
and `.out` (the module's output). With them, `run_with_cache` and the cache's residual analysis
(`accumulated_resid`, `apply_ln_to_stack`, and for the pre-norm families `decompose_resid` and
`logit_attrs`) work on the wrapper as on a normlab model.

`blocks.{i}` fires once per forward at the layer's output, called as `block(x_in, carry,
x_out)` with the layer's input and output and an empty `normlab.nn.block.Carry`, and returns
`(x_out, carry)`, as a normlab block returns `(x, carry)`; the first tensor of what it returns
becomes the layer output (normlab's layer-drop hooks return the block's inputs, so `x_in`).
Pre-hooks on `blocks.{i}` run at that point too, so they cannot change the layer's input (use
`attn.stream_in`).

`skip_blocks(hf_model, [i, ...])` is the direct way to drop layers (layer drop) with hooks.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from normlab.interop.errors import InteropError
from normlab.nn.analysis import NormSpec, norm_spec
from normlab.nn.block import Carry
from normlab.nn.hooked import HookedMixin
from normlab.nn.model import ModelOutput
from normlab.nn.norms import add_norm_taps
from normlab.nn.taps import Tap, active, current_name

SUBLAYER_TAPS = ("stream_in", "branch_in", "branch_raw", "branch_added", "stream_out")
ATTENTION_TAPS = ("q", "k", "v", "pattern")


@dataclass(frozen=True)
class AttentionSites:
    """Where a block's attention exposes q, k, v and its weights (paths relative to the layer).
    `qkv` is one path (a fused projection, split into three) or three (q, k, v); `rope`: the
    module's forward receives `position_embeddings=(cos, sin)` and rotates q and k with them."""

    module: str
    qkv: tuple[str, ...]
    rope: bool = False


@dataclass(frozen=True)
class Family:
    """How one family of Hugging Face models lays out a block. `sites[tap]` is
    `(module path relative to the layer, "in" | "out", writable)`."""

    name: str
    model_types: tuple[str, ...]
    placement: str  # "pre" | "post"
    norm: str  # "layernorm" | "rmsnorm"
    layers: str  # path of the ModuleList of blocks in the base model
    final_norm: str | None  # path of the final norm in the base model
    sites: dict[str, tuple[str, str, bool]]
    norms: dict[str, str]  # normlab's norm name in a block (`attn.in_norm`) -> module path
    attention: AttentionSites


def _pre_sites(ln1: str, attn: str, ln2: str, mlp: str) -> dict[str, tuple[str, str, bool]]:
    return {
        "attn.stream_in": ("", "in", True), "attn.branch_in": (ln1, "out", True),
        "attn.branch_raw": (attn, "out", True), "attn.branch_added": (attn, "out", True),
        # the residual add happens inside the layer's forward: observable at ln2's input only
        "attn.stream_out": (ln2, "in", False), "mlp.stream_in": (ln2, "in", False),
        "mlp.branch_in": (ln2, "out", True),
        "mlp.branch_raw": (mlp, "out", True), "mlp.branch_added": (mlp, "out", True),
        "mlp.stream_out": ("", "out", True),
    }


HF_FAMILIES: dict[str, Family] = {
    "bert": Family(
        "bert", ("bert", "roberta", "xlm-roberta"), "post", "layernorm", "encoder.layer", None,
        {"attn.stream_in": ("", "in", True),
         "attn.branch_in": ("attention.self", "in", True),
         "attn.branch_raw": ("attention.output.dense", "out", True),
         "attn.branch_added": ("attention.output.dense", "out", True),
         "attn.stream_out": ("attention", "out", True),
         "mlp.stream_in": ("attention", "out", True),
         "mlp.branch_in": ("intermediate", "in", True),
         "mlp.branch_raw": ("output.dense", "out", True),
         "mlp.branch_added": ("output.dense", "out", True),
         "mlp.stream_out": ("", "out", True)},
        {"attn.post_norm": "attention.output.LayerNorm", "mlp.post_norm": "output.LayerNorm"},
        AttentionSites("attention.self", ("attention.self.query", "attention.self.key",
                                          "attention.self.value"))),
    "gpt2": Family("gpt2", ("gpt2",), "pre", "layernorm", "h", "ln_f",
                   _pre_sites("ln_1", "attn", "ln_2", "mlp"),
                   {"attn.in_norm": "ln_1", "mlp.in_norm": "ln_2"},
                   AttentionSites("attn", ("attn.c_attn",))),
    "llama": Family("llama", ("llama", "mistral", "qwen2", "qwen3"), "pre", "rmsnorm", "layers",
                    "norm", _pre_sites("input_layernorm", "self_attn",
                                       "post_attention_layernorm", "mlp"),
                    {"attn.in_norm": "input_layernorm", "mlp.in_norm": "post_attention_layernorm"},
                    AttentionSites("self_attn", ("self_attn.q_proj", "self_attn.k_proj",
                                                 "self_attn.v_proj"), rope=True)),
}


def family_of(hf_model: nn.Module) -> Family:
    """The `Family` of a transformers model, by its `config.model_type`."""
    model_type = getattr(getattr(hf_model, "config", None), "model_type", None)
    for fam in HF_FAMILIES.values():
        if model_type in fam.model_types:
            return fam
    known = ", ".join(t for f in HF_FAMILIES.values() for t in f.model_types)
    raise InteropError(f"model_type {model_type!r} ({type(hf_model).__name__}) has no tap "
                       f"adapter; supported model types: {known}")


def base_of(hf_model: nn.Module) -> nn.Module:
    """The headless base model (`model.bert`, `model.transformer`, `model.model`, or itself)."""
    base = getattr(hf_model, "base_model", None)
    return base if isinstance(base, nn.Module) else hf_model


def layers_of(hf_model: nn.Module) -> nn.ModuleList:
    return base_of(hf_model).get_submodule(family_of(hf_model).layers)


def objective_of(hf_model: nn.Module) -> str:
    """`causal_lm`, `masked_lm` or `none` (a headless encoder such as a sentence embedder)."""
    name = type(hf_model).__name__
    if name.endswith(("ForCausalLM", "LMHeadModel")):
        return "causal_lm"
    if name.endswith("ForMaskedLM"):
        return "masked_lm"
    return "none"


# --- values at a site: tensors, tuples whose first item is the hidden state, or kwargs ---------

def _first(out: Any) -> torch.Tensor:
    return out[0] if isinstance(out, (tuple, list)) else out


def _with_first(out: Any, value: torch.Tensor) -> Any:
    if isinstance(out, tuple):
        return (value, *out[1:])
    if isinstance(out, list):
        return [value, *out[1:]]
    return value


def _input_of(args: tuple, kwargs: dict) -> torch.Tensor:
    return args[0] if args else kwargs["hidden_states"]


def _with_input(args: tuple, kwargs: dict, value: torch.Tensor) -> tuple[tuple, dict]:
    if args:
        return (value, *args[1:]), kwargs
    return args, {**kwargs, "hidden_states": value}


@contextmanager
def skip_blocks(hf_model: nn.Module, blocks: Iterable[int]) -> Iterator[None]:
    """Within the block, each listed layer of `hf_model` returns its input (layer drop): a
    forward pre-hook keeps the input, a forward hook returns it in place of the output. The
    hooks are removed on exit; the model is not modified. Use with `use_cache=False`."""
    layers = layers_of(hf_model)
    chosen = sorted(set(blocks))
    bad = [i for i in chosen if not 0 <= i < len(layers)]
    if bad:
        raise InteropError(f"blocks {bad} out of range: the model has {len(layers)} blocks")
    handles = []
    try:
        for i in chosen:
            kept: dict[str, torch.Tensor] = {}

            def pre(_m, args, kwargs, kept=kept) -> None:
                kept["x"] = _input_of(args, kwargs)

            def post(_m, _args, out, kept=kept) -> Any:
                return _with_first(out, kept.pop("x"))

            handles.append(layers[i].register_forward_pre_hook(pre, with_kwargs=True))
            handles.append(layers[i].register_forward_hook(post))
        yield
    finally:
        for h in handles:
            h.remove()


# --- the wrapper -------------------------------------------------------------------------------

@dataclass(frozen=True)
class HFModelInfo:
    """What the probes read from `model.cfg`. `kind` is `decoder` for causal LMs (next-token
    logits) and `encoder` otherwise."""

    kind: str
    family: str
    model_type: str
    objective: str
    placement: str
    norm: str
    n_blocks: int
    d_model: int
    n_heads: int
    vocab_size: int
    architecture: str

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


@dataclass(frozen=True)
class HFPlan:
    placement: str
    embed_norm: str | None
    final_norm: str | None
    dual_stream: bool = False


class _SublayerTaps(nn.Module):
    def __init__(self, norms: Iterable[str] = (), attention: bool = False) -> None:
        super().__init__()
        for name in SUBLAYER_TAPS:
            self.add_module(name, Tap())
        for name in norms:  # in_norm / post_norm: a holder of the norm taps
            self.add_module(name, _NormTaps())
        if attention:  # attn.fn.{q,k,v,pattern}, as on normlab's attention
            self.add_module("fn", nn.Module())
            for name in ATTENTION_TAPS:
                self.fn.add_module(name, Tap())


class _NormTaps(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        add_norm_taps(self, scale=True)


class BlockProxy(nn.Module):
    """Stands for Hugging Face layer i: hooks on it see `(x_in, carry, x_out)` and the output
    `(x_out, carry)`, as a normlab block's `(x, carry, ctx)` and `(x, carry)`."""

    def __init__(self, norms: Iterable[str] = ()) -> None:
        super().__init__()
        norms = list(norms)
        for kind in ("attn", "mlp"):
            self.add_module(kind, _SublayerTaps((n.split(".")[1] for n in norms
                                                 if n.startswith(kind + ".")),
                                                attention=kind == "attn"))

    def forward(self, x: torch.Tensor, carry: Carry, out: torch.Tensor
                ) -> tuple[torch.Tensor, Carry]:
        return out, carry


class HFTapModel(HookedMixin, nn.Module):
    """A Hugging Face model seen through normlab's tap names (see the module doc)."""

    def __init__(self, hf_model: nn.Module) -> None:
        super().__init__()
        fam = family_of(hf_model)
        self.family = fam
        self.hf = hf_model
        base = base_of(hf_model)
        self._layers = base.get_submodule(fam.layers)
        self._final_norm = base.get_submodule(fam.final_norm) if fam.final_norm else None
        c = hf_model.config
        self.objective = objective_of(hf_model)
        self.cfg = HFModelInfo(
            kind="decoder" if self.objective == "causal_lm" else "encoder", family=fam.name,
            model_type=c.model_type, objective=self.objective, placement=fam.placement,
            norm=fam.norm, n_blocks=len(self._layers), d_model=c.hidden_size,
            n_heads=c.num_attention_heads, vocab_size=c.vocab_size,
            architecture=type(hf_model).__name__)
        self.plan = HFPlan(fam.placement, "layernorm" if fam.name == "bert" else None,
                           fam.norm if fam.final_norm else None)
        self.blocks = nn.ModuleList(BlockProxy(fam.norms) for _ in range(len(self._layers)))
        self.final = nn.Module()
        self.final.add_module("input", Tap())
        if self._final_norm is not None:
            self.final.add_module("norm", _NormTaps())
        self.final.add_module("out", Tap())

    # -- where each tap lives ------------------------------------------------------------------
    def site_of(self, tap: str) -> str:
        """The Hugging Face module (and side) that carries tap `tap`, e.g.
        `model.layers.3.post_attention_layernorm (input)`."""
        base_name = {id(m): n for n, m in self.hf.named_modules()}
        parts = current_name(tap).split(".")
        if parts[-2:-1] in (["in_norm"], ["post_norm"]) or parts[:2] == ["final", "norm"]:
            norm = self._norm_module(".".join(parts[:-1]))
            side = {"input": "input", "out": "output", "scale": "scale, from the input"}[
                parts[-1]]
            return f"{base_name[id(norm)]} ({side})"
        if parts[0] == "final":
            if self._final_norm is None:
                return f"{base_name[id(self._layers[-1])]} (output)"
            side = "input" if parts[1] == "input" else "output"
            return f"{base_name[id(self._final_norm)]} ({side})"
        i, rest = int(parts[1]), ".".join(parts[2:])
        layer = self._layers[i]
        if not rest:
            return f"{base_name[id(layer)]} (output)"
        if parts[2:4] == ["attn", "fn"]:
            att = self.family.attention
            if parts[4] == "pattern":
                return (f"{base_name[id(layer.get_submodule(att.module))]} (output[1], the "
                        "attention weights of the eager path, read-only)")
            fused = len(att.qkv) == 1
            path = att.qkv[0] if fused else att.qkv["qkv".index(parts[4])]
            how = f"{'qkv'.index(parts[4]) + 1}/3 of the output" if fused else "output"
            rope = ", RoPE applied" if att.rope and parts[4] != "v" else ""
            return f"{base_name[id(layer.get_submodule(path))]} ({how}, per head{rope}, read-only)"
        path, side, writable = self.family.sites[rest]
        module = layer.get_submodule(path) if path else layer
        ro = "" if writable else ", read-only"
        return f"{base_name[id(module)]} ({'input' if side == 'in' else 'output'}{ro})"

    def _norm_module(self, name: str) -> nn.Module:
        """The Hugging Face norm module of normlab norm `name` (`blocks.3.attn.in_norm`,
        `final.norm`)."""
        if name == "final.norm":
            return self._final_norm
        _, i, rest = name.split(".", 2)
        return self._layers[int(i)].get_submodule(self.family.norms[rest])

    def _norms(self) -> Iterator[tuple[str, nn.Module, nn.Module]]:
        """(normlab name, Hugging Face module, tap holder) of every norm."""
        for i, proxy in enumerate(self.blocks):
            for rest in self.family.norms:
                name = f"blocks.{i}.{rest}"
                yield name, self._norm_module(name), proxy.get_submodule(rest)
        if self._final_norm is not None:
            yield "final.norm", self._final_norm, self.final.norm

    def tap_table(self) -> list[tuple[str, str]]:
        names = [n for n, m in self.named_modules() if isinstance(m, Tap)]
        return [(n, self.site_of(n)) for n in names]

    # -- the bridge ----------------------------------------------------------------------------
    def _fire(self, taps: Sequence[tuple[str, nn.Module, bool]], value: torch.Tensor
              ) -> torch.Tensor:
        for name, tap, writable in taps:
            if not active(tap):
                continue
            new = tap(value)
            if new is not value:
                if not writable:
                    raise InteropError(
                        f"tap {name} is read-only on {self.family.name} models: the residual "
                        "add happens inside the layer's forward; replace "
                        f"{name.rsplit('.', 2)[0]}.branch_added or .stream_out instead")
                value = new
        return value

    @contextmanager
    def _bridge(self) -> Iterator[None]:
        fam = self.family
        handles = []
        last = len(self._layers) - 1

        def on_input(taps):
            def hook(_m, args, kwargs):
                x = _input_of(args, kwargs)
                y = self._fire(taps, x)
                return None if y is x else _with_input(args, kwargs, y)
            return hook

        def on_output(taps):
            def hook(_m, _args, out):
                x = _first(out)
                y = self._fire(taps, x)
                return None if y is x else _with_first(out, y)
            return hook

        try:
            for i, layer in enumerate(self._layers):
                proxy = self.blocks[i]
                by_site: dict[tuple[str, str], list] = {}
                for kind in ("attn", "mlp"):
                    for tname in SUBLAYER_TAPS:
                        path, side, writable = fam.sites[f"{kind}.{tname}"]
                        tap = getattr(getattr(proxy, kind), tname)
                        by_site.setdefault((path, side), []).append(
                            (f"blocks.{i}.{kind}.{tname}", tap, writable))
                layer_in = by_site.pop(("", "in"), [])
                layer_out = by_site.pop(("", "out"), [])
                for (path, side), taps in by_site.items():
                    module = layer.get_submodule(path)
                    if side == "in":
                        handles.append(module.register_forward_pre_hook(
                            on_input(taps), with_kwargs=True))
                    else:
                        handles.append(module.register_forward_hook(on_output(taps)))
                kept: dict[str, torch.Tensor] = {}

                def pre(_m, args, kwargs, taps=layer_in, kept=kept):
                    x = _input_of(args, kwargs)
                    y = self._fire(taps, x)
                    kept["x"] = y
                    return None if y is x else _with_input(args, kwargs, y)

                def post(_m, _args, out, taps=layer_out, kept=kept, proxy=proxy, i=i):
                    x = _first(out)
                    y = self._fire(taps, x)
                    if active(proxy):
                        y = proxy(kept["x"], Carry(), y)[0]
                    if i == last and self._final_norm is None:
                        y = self._fire([("final.input", self.final.input, True),
                                        ("final.out", self.final.out, True)], y)
                    kept.clear()
                    return None if y is x else _with_first(out, y)

                handles.append(layer.register_forward_pre_hook(pre, with_kwargs=True))
                handles.append(layer.register_forward_hook(post))
                handles.extend(self._attention_bridge(i, layer))
            for name, module, taps in self._norms():
                handles.extend(self._norm_bridge(name, module, taps))
            if self._final_norm is not None:
                handles.append(self._final_norm.register_forward_pre_hook(
                    on_input([("final.input", self.final.input, True)]),
                    with_kwargs=True))
                handles.append(self._final_norm.register_forward_hook(
                    on_output([("final.out", self.final.out, True)])))
            yield
        finally:
            for h in handles:
                h.remove()

    def _wants_pattern(self) -> bool:
        return any(active(proxy.attn.fn.pattern) for proxy in self.blocks)

    @contextmanager
    def _eager_attention(self) -> Iterator[None]:
        """While a `pattern` tap is hooked, the forward runs transformers' eager attention (sdpa
        and flash attention return no weights); the model's own implementation is restored on
        exit, also after an exception. The eager attention modules return their weights
        without `output_attentions=True`, which is not passed: in transformers 5 it installs
        output-recording hooks on the model that stay after the forward."""
        config = self.hf.config
        before = config._attn_implementation
        if not self._wants_pattern() or before == "eager":
            yield
            return
        setter = getattr(self.hf, "set_attn_implementation", None)

        def set_impl(name: str) -> None:
            if setter is not None:
                setter(name)
            else:  # older transformers: the config field the attention modules read
                config._attn_implementation = name

        set_impl("eager")
        try:
            yield
        finally:
            set_impl(before)

    def _fire_read_only(self, name: str, tap: nn.Module, value: torch.Tensor) -> None:
        if tap(value) is not value:
            raise InteropError(f"tap {name} is read-only on Hugging Face models: it is "
                               "recomputed from the model's own projections; replace "
                               f"{name.rsplit('.', 2)[0]}.branch_in or .branch_raw instead")

    def _attention_bridge(self, i: int, layer: nn.Module) -> list[Any]:
        """Hooks that fire `blocks.{i}.attn.fn.{q,k,v,pattern}` (only those that are hooked):
        q, k, v from the projections' outputs, reshaped to [B, heads, T, head_dim] (with RoPE
        applied to q and k on the Llama family, as the attention itself does), the pattern from
        the attention module's output (its weights, present on the eager path)."""
        att = self.family.attention
        fn = self.blocks[i].attn.fn
        module = layer.get_submodule(att.module)
        wanted = [n for n in "qkv" if active(getattr(fn, n))]
        handles = []
        if active(fn.pattern):
            def on_weights(_m, _args, out):
                weights = out[1] if isinstance(out, (tuple, list)) and len(out) > 1 else None
                if weights is None:
                    raise InteropError(
                        f"blocks.{i}.attn.fn.pattern: {type(module).__name__} returned no "
                        f"attention weights (attention implementation "
                        f"{self.hf.config._attn_implementation!r}); use eager attention")
                self._fire_read_only(f"blocks.{i}.attn.fn.pattern", fn.pattern, weights)
            handles.append(module.register_forward_hook(on_weights))
        if not wanted:
            return handles
        head_dim = getattr(module, "head_dim", None) or module.attention_head_size
        rotation: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        if att.rope:
            def keep_rotation(_m, _args, kwargs):
                rotation["cos_sin"] = kwargs["position_embeddings"]
            handles.append(module.register_forward_pre_hook(keep_rotation, with_kwargs=True))

        def per_head(x: torch.Tensor, which: str) -> torch.Tensor:
            x = x.view(*x.shape[:-1], -1, head_dim)
            norm = getattr(module, f"{which}_norm", None)  # Qwen3's per-head q/k RMSNorm
            if norm is not None:
                x = norm(x)
            x = x.transpose(1, 2)  # [B, H, T, head_dim]
            if att.rope and which != "v":
                cos, sin = rotation["cos_sin"]
                cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
                half = x.shape[-1] // 2
                x = x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin
            return x

        def on_projection(names: str):
            def hook(_m, _args, out):
                parts = out.chunk(3, dim=-1) if len(names) == 3 else (out,)
                for which, part in zip(names, parts, strict=True):
                    if which in wanted:
                        self._fire_read_only(f"blocks.{i}.attn.fn.{which}",
                                             getattr(fn, which), per_head(part, which))
            return hook

        if len(att.qkv) == 1:
            handles.append(layer.get_submodule(att.qkv[0]).register_forward_hook(
                on_projection("qkv")))
        else:
            for which in wanted:
                handles.append(layer.get_submodule(att.qkv["qkv".index(which)])
                               .register_forward_hook(on_projection(which)))
        return handles

    def _norm_bridge(self, name: str, module: nn.Module, taps: nn.Module) -> list[Any]:
        """Hooks that pass a Hugging Face norm's input, scale and output through its taps. The
        pre-hook runs after the site hooks on the module's input and the forward hook before
        those on its output, the order of normlab's own norm taps."""
        spec = norm_spec(module, self.family.norm, name)
        kept: dict[str, torch.Tensor] = {}
        tap_in, tap_out = taps.input, taps.out

        def pre(_m, args, kwargs):
            x = _input_of(args, kwargs)
            y = self._fire([(f"{name}.input", tap_in, True)], x)
            if active(taps.scale):
                scale = spec.scale_of(y)
                new = taps.scale(scale)
                if new is not scale:  # recompute the output with the replaced scale
                    kept["x"], kept["scale"] = y, new
            return None if y is x else _with_input(args, kwargs, y)

        def post(_m, _args, out):
            x = _first(out)
            y = x
            if kept:
                y = spec.apply(kept.pop("x"), kept.pop("scale"), add_bias=True).to(x.dtype)
            y = self._fire([(f"{name}.out", tap_out, True)], y)
            return None if y is x else _with_first(out, y)

        return [module.register_forward_pre_hook(pre, with_kwargs=True),
                module.register_forward_hook(post, prepend=True)]

    # -- what the residual-stream analysis reads (`normlab.nn.analysis`) -----------------------
    def residual_sum_problem(self) -> str | None:
        if self.family.placement == "post":
            return (f"blocks.0.attn ({self.family.name}, post-LN) re-normalizes the stream after "
                    "its add")
        return None

    def analysis_norm(self, site: str) -> NormSpec | None:
        """The norm reading the stream at `site`: `final` or `blocks.{i}.{attn|mlp}`."""
        name = "final.norm" if site == "final" else f"{site}.in_norm"
        if site == "final" and self._final_norm is None:
            return None
        if site != "final" and name.split(".", 2)[2] not in self.family.norms:
            return None  # post-LN: the sublayer reads the stream as it is
        return norm_spec(self._norm_module(name), self.family.norm, name)

    def analysis_unembed(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        head = self.hf.get_output_embeddings() if self.objective == "causal_lm" else None
        if head is None:
            raise InteropError(f"logit attribution needs a causal LM head; "
                               f"{self.cfg.architecture} is {self.objective}")
        return head.weight, head.bias

    # -- forwards ------------------------------------------------------------------------------
    def _kwargs(self, attention_mask: torch.Tensor | None) -> dict[str, Any]:
        kw: dict[str, Any] = {}
        if attention_mask is not None:
            kw["attention_mask"] = attention_mask
        if self.family.placement == "pre":  # the decoders: no KV cache while probing
            kw["use_cache"] = False
        return kw

    def stream(self, idx: torch.Tensor, attention_mask: torch.Tensor | None = None
               ) -> torch.Tensor:
        """The final stream `[B, T, d]` (after the final norm where the model has one)."""
        with self._eager_attention(), self._bridge():
            out = base_of(self.hf)(input_ids=idx, **self._kwargs(attention_mask))
        return _first(out) if not hasattr(out, "last_hidden_state") else out.last_hidden_state

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None) -> ModelOutput:
        """Token logits `[B, T, V]` of a model with an LM head, and the mean cross-entropy
        against `targets` `[B, T]` aligned with the logits (-100 ignored): next tokens for a
        causal LM, the original tokens at masked positions for a masked LM."""
        if self.objective == "none":
            raise InteropError(f"{self.cfg.architecture} has no LM head; use stream() (or load "
                               "the checkpoint with its ...ForCausalLM / ...ForMaskedLM class)")
        with self._eager_attention(), self._bridge():
            logits = self.hf(input_ids=idx, **self._kwargs(attention_mask)).logits
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.flatten(0, -2).float(), targets.flatten(),
                                   ignore_index=-100)
        return ModelOutput(logits, loss)


def tap_model(hf_model: nn.Module) -> HFTapModel:
    """`HFTapModel(hf_model)`: normlab's tap names on a transformers model."""
    return HFTapModel(hf_model)


@contextmanager
def capture_hf(hf_model: nn.Module | HFTapModel, names: str | Sequence[str] = "*"
               ) -> Iterator[tuple[HFTapModel, Any]]:
    """`with capture_hf(hf, "blocks.*.mlp.stream_out") as (m, cap): m.stream(idx)`: normlab's
    `capture` on a Hugging Face model (`cap["blocks.3.mlp.stream_out"]`)."""
    from normlab.nn.taps import capture

    m = hf_model if isinstance(hf_model, HFTapModel) else HFTapModel(hf_model)
    with capture(m, names) as cap:
        yield m, cap
