"""Residual-stream analysis on a cache: `accumulated_resid`, `decompose_resid`, `apply_ln_to_stack`,
`logit_attrs` (the methods of TransformerLens's `ActivationCache` of the same names, Nanda and
Bloom, github.com/TransformerLensOrg/TransformerLens), written for normlab's tap names and
normlab's placements, and for Hugging Face models seen through `normlab.interop.HFTapModel`.

    logits, cache = model.run_with_cache(tokens)
    stack, labels = cache.decompose_resid(return_labels=True)   # [C, B, T, d]: embed, 0_attn_out,
    attrs = cache.logit_attrs(stack, next_tokens)                #   0_mlp_out, ...; attrs [C, B, T]
    attrs.sum(0) + cache.logit_bias(next_tokens)                 # == the logits of next_tokens

Which streams: `resid_pre` of block l is tap `blocks.{l}.attn.stream_in`, `resid_mid` is
`blocks.{l}.attn.stream_out`, the final stream `blocks.{L-1}.mlp.stream_out`. A sublayer's
component is its `branch_added` tap (after any output norm or gate). The norm that reads a stream
is block l's attention (or, with `mlp_input`, MLP) input norm `blocks.{l}.{attn|mlp}.in_norm`, and
`final.norm` for the head; where there is none (post-norm blocks, no final norm) the reader sees
the stream as it is and "applying the norm" is the identity.

Freezing the scale (TransformerLens's `ln_final` with the cached `hook_scale`) makes the norm
linear: `N(x) ~ centre(x) * s * w + b` with `s` the per-token factor the norm used on the whole
stream in the cached forward (tap `{norm}.scale`), so the norm of a sum is the sum of the parts'
images plus the bias once. That bias belongs to no component: `apply_ln_to_stack` adds it only
with `add_bias=True` (the default, for stacks of whole streams) and `logit_bias` gives its share
of a logit. Unlike TransformerLens, normlab does not fold the norm's weight into the next layer:
`apply_ln_to_stack` applies the weight itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from normlab.nn.norms import POINTWISE_KINDS, layernorm_scale, rmsnorm_scale


@dataclass(frozen=True)
class NormSpec:
    """A norm as the analysis applies it: its kind, affine parameters, eps and tap prefix."""

    kind: str  # layernorm | rmsnorm | dyt | derf
    module: nn.Module
    tap: str  # e.g. "final.norm"; its scale tap is f"{tap}.scale"

    @property
    def eps(self) -> float:
        eps = getattr(self.module, "eps", None)
        if eps is None:
            eps = getattr(self.module, "variance_epsilon", None)  # Llama's RMSNorm
        return float(eps) if eps is not None else torch.finfo(torch.float32).eps

    @property
    def bias(self) -> torch.Tensor | None:
        return getattr(self.module, "bias", None)

    def scale_of(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "layernorm":
            return layernorm_scale(x, self.eps)
        return rmsnorm_scale(x, self.eps)

    def apply(self, x: torch.Tensor, scale: torch.Tensor | None, add_bias: bool) -> torch.Tensor:
        """`centre(x) * scale * weight (+ bias)`; `scale=None` recomputes it from `x` itself
        (for DyT and Derf, the module itself, without its bias unless `add_bias`)."""
        if self.kind in POINTWISE_KINDS:
            y = self.module(x)
            return y if add_bias or self.bias is None else y - self.bias
        if scale is None:
            scale = self.scale_of(x)
        xf = x.to(torch.promote_types(x.dtype, scale.dtype))
        if self.kind == "layernorm":
            xf = xf - xf.mean(-1, keepdim=True)
        y = xf * scale
        weight = getattr(self.module, "weight", None)
        if weight is not None:
            y = y * weight
        if add_bias and self.bias is not None:
            y = y + self.bias
        return y


STACKABLE_NORM_KINDS = ("layernorm", "rmsnorm", *POINTWISE_KINDS)


def norm_spec(module: nn.Module | None, kind: str | None, tap: str) -> NormSpec | None:
    """The `NormSpec` of a norm module, or None for no norm (or an identity)."""
    if module is None or kind is None or kind == "identity":
        return None
    if kind not in STACKABLE_NORM_KINDS:
        raise ValueError(f"{tap}: a {kind} norm cannot be applied to a stack; the analysis "
                         f"supports {', '.join(STACKABLE_NORM_KINDS)}")
    return NormSpec(kind, module, tap)


def residual_sum_problem(plan: Any) -> str | None:
    """Why the stream of a normlab model's `ModelPlan` is not embedding + sublayer outputs
    (None when it is): the first sublayer that breaks the sum."""
    if plan.dual_out_norm is not None:
        return "SiameseNorm's head reads Norm(Norm(a) + Norm(d)), two streams"
    if plan.dual_stream:
        return "ResiDual's head reads a + Norm(d), two streams"
    for b in plan.blocks:
        for s in b.sublayers:
            where = f"blocks.{b.index}.{s.kind} ({b.placement})"
            if s.hypersphere:
                return f"{where} moves the stream along the unit sphere (nGPT), not by a sum"
            if s.post_norm:
                return f"{where} re-normalizes the stream after its add"
            if s.skip_learned or s.skip_scale != 1.0:
                return f"{where} scales the skip"
            if s.add_block_input:
                return f"{where} adds the block input a second time"
            if s.skip_normed:
                return f"{where} takes its skip after the input norm"
    return None


def _layer(layer: int | None, n_blocks: int, what: str) -> int:
    """TransformerLens's convention: None, -1 and n_blocks mean the final stream (the head)."""
    if layer is None or layer == -1:
        return n_blocks
    if not 0 <= layer <= n_blocks:
        raise ValueError(f"{what}: layer={layer} is out of range; use 0..{n_blocks} (or -1 / None "
                         "for the final stream)")
    return layer


class ResidualAnalysis:
    """The analysis methods of `ActivationCache` (see the module doc). Needs `self.model`: the
    model that filled the cache, which says where its norms are (`analysis_norm`), whether its
    stream is a sum of sublayer outputs (`residual_sum_problem`) and what its unembedding is
    (`analysis_unembed`)."""

    model: Any
    n_blocks: int

    def _need(self, name: str, what: str) -> torch.Tensor:
        if name not in self:  # type: ignore[operator]  # the cache is a Mapping
            raise KeyError(f"{what} needs tap {name!r}, which is not in the cache; run_with_cache "
                           "with names_filter=None (every tap) or including it")
        return self[name]  # type: ignore[index]

    def _model(self, what: str) -> Any:
        if getattr(self, "model", None) is None:
            raise ValueError(f"{what} needs the model: build the cache with run_with_cache (or "
                             "ActivationCache(..., model=model))")
        return self.model

    # -- streams -------------------------------------------------------------------------------
    def accumulated_resid(self, layer: int | None = None, incl_mid: bool = False,
                          apply_ln: bool = False, mlp_input: bool = False,
                          freeze_scale: bool = True, return_labels: bool = False) -> Any:
        """The residual stream at the start of each block up to `layer`, stacked:
        [C, B, T, d] with labels `{l}_pre` (`blocks.{l}.attn.stream_in`), with `incl_mid` also
        `{l}_mid` (`blocks.{l}.attn.stream_out`), and for layer None / -1 / n_blocks the final
        stream `final_post` (`blocks.{L-1}.mlp.stream_out`, before the final norm). `mlp_input`
        adds layer's own `_mid`. `apply_ln` passes the stack through the norm that reads the
        stream at `layer` (`apply_ln_to_stack`, bias included: a logit lens for `layer=None`).
        Works for every placement: for post-type ones these are the re-normalized streams."""
        what = "accumulated_resid"
        L = self.n_blocks
        layer = _layer(layer, L, what)
        incl_mid = incl_mid or mlp_input
        parts, labels = [], []
        for i in range(layer + 1):
            if i == L:
                parts.append(self._need(f"blocks.{L - 1}.mlp.stream_out", what))
                labels.append("final_post")
                continue
            parts.append(self._need(f"blocks.{i}.attn.stream_in", what))
            labels.append(f"{i}_pre")
            if (incl_mid and i < layer) or (mlp_input and i == layer):
                parts.append(self._need(f"blocks.{i}.attn.stream_out", what))
                labels.append(f"{i}_mid")
        stack = torch.stack(parts)
        if apply_ln:
            stack = self.apply_ln_to_stack(stack, layer, mlp_input=mlp_input,
                                           freeze_scale=freeze_scale, add_bias=True)
        return (stack, labels) if return_labels else stack

    def decompose_resid(self, layer: int | None = None, mlp_input: bool = False,
                        mode: Literal["all", "attn", "mlp"] = "all", apply_ln: bool = False,
                        incl_embeds: bool = True, return_labels: bool = False) -> Any:
        """The stream at `layer` split into what was added to it: `embed` (the stream entering
        block 0: token plus position embedding, after any embedding norm), then
        `{l}_attn_out` and `{l}_mlp_out` (taps `blocks.{l}.{attn|mlp}.branch_added`) for the
        blocks before `layer`; [C, B, T, d]. Summed, the components are the stream exactly, in
        the order the model added them. `mode` keeps only attention or MLP outputs; `mlp_input`
        adds layer's attention output; `apply_ln` applies the reading norm with its frozen
        scale and without its bias (`logit_bias`).

        Only for placements whose stream is such a sum (pre, sandwich / peri, LNS, ReZero,
        SkipInit, hybrid_star's first block): where the stream is re-normalized after an add
        (post, DeepNorm, Admin, B2T, mix's post blocks), scaled (DeepNorm, Admin), or its skip
        taken after a norm (HybridNorm's MLP), no such split exists and this raises."""
        what = "decompose_resid"
        model = self._model(what)
        problem = model.residual_sum_problem()
        if problem:
            raise ValueError(f"decompose_resid: {problem}; the stream is not a sum of sublayer "
                             "outputs there (use accumulated_resid for the streams themselves)")
        if mode not in ("all", "attn", "mlp"):
            raise ValueError(f"decompose_resid: mode={mode!r}; use 'all', 'attn' or 'mlp'")
        L = self.n_blocks
        layer = _layer(layer, L, what)
        parts, labels = [], []
        if incl_embeds:
            parts.append(self._need("blocks.0.attn.stream_in", what))
            labels.append("embed")
        kinds = [k for k in ("attn", "mlp") if mode in ("all", k)]
        for i in range(layer):
            for k in kinds:
                parts.append(self._need(f"blocks.{i}.{k}.branch_added", what))
                labels.append(f"{i}_{k}_out")
        if mlp_input and layer < L and mode != "mlp":
            parts.append(self._need(f"blocks.{layer}.attn.branch_added", what))
            labels.append(f"{layer}_attn_out")
        if not parts:
            raise ValueError("decompose_resid: nothing to decompose (layer=0 without the "
                             "embedding)")
        stack = torch.stack(parts)
        if apply_ln:
            stack = self.apply_ln_to_stack(stack, layer, mlp_input=mlp_input, add_bias=False)
        return (stack, labels) if return_labels else stack

    # -- norms ---------------------------------------------------------------------------------
    def reading_norm(self, layer: int | None = None, mlp_input: bool = False
                     ) -> NormSpec | None:
        """The norm that reads the stream at `layer` (the final norm for None / -1 / n_blocks),
        or None where the reader takes the stream as it is."""
        what = "apply_ln_to_stack"
        model = self._model(what)
        layer = _layer(layer, self.n_blocks, what)
        if layer == self.n_blocks:
            return model.analysis_norm("final")
        return model.analysis_norm(f"blocks.{layer}.{'mlp' if mlp_input else 'attn'}")

    def apply_ln_to_stack(self, stack: torch.Tensor, layer: int | None = None,
                          mlp_input: bool = False, freeze_scale: bool = True,
                          add_bias: bool = True) -> torch.Tensor:
        """Apply the norm that reads the stream at `layer` (the final norm by default) to each
        element of `stack` [..., B, T, d]. `freeze_scale=True` uses the per-token scale the norm
        computed in the cached forward (tap `{norm}.scale`), which makes it linear: applied to
        the whole cached stream this is the norm's output, and the images of a decomposition
        sum to it (minus the bias, added once with `add_bias`). `freeze_scale=False` recomputes
        the scale of each element from the element itself (not linear). Without a norm there
        (post-type blocks, no final norm) the stack comes back unchanged."""
        spec = self.reading_norm(layer, mlp_input)
        if spec is None:
            return stack
        scale = None
        if freeze_scale:
            if spec.kind in POINTWISE_KINDS:
                what = ("DyT, tanh(alpha x)" if spec.kind == "dyt"
                        else "Derf, erf(alpha x + s)")
                raise ValueError(f"apply_ln_to_stack: {spec.tap} is {what} per "
                                 "feature with no per-token scale to freeze; pass "
                                 "freeze_scale=False to apply it to each element")
            scale = self._need(f"{spec.tap}.scale", "apply_ln_to_stack(freeze_scale=True)")
        return spec.apply(stack, scale, add_bias)

    # -- logits --------------------------------------------------------------------------------
    def _directions(self, tokens: int | torch.Tensor, incorrect: int | torch.Tensor | None,
                    what: str) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor,
                                        torch.Tensor | None]:
        weight, bias = self._model(what).analysis_unembed()
        t = torch.as_tensor(tokens, device=weight.device)
        if t.ndim not in (0, 2):
            raise ValueError(f"{what}: tokens must be one token id or a [batch, pos] tensor of "
                             f"ids (one per position); got shape {tuple(t.shape)}")
        u = torch.as_tensor(incorrect, device=weight.device) if incorrect is not None else None
        return weight, bias, t, u

    def logit_attrs(self, stack: torch.Tensor, tokens: int | torch.Tensor,
                    incorrect_tokens: int | torch.Tensor | None = None) -> torch.Tensor:
        """Each component's direct contribution to the logit of `tokens` (one id, or [B, T] ids,
        e.g. the next tokens): the component through the final norm with its frozen scale (no
        bias) and the unembedding, [C, B, T] for a stack [C, B, T, d]. With
        `incorrect_tokens`, the contribution to the logit difference `tokens - incorrect`.
        Summed over a `decompose_resid()` stack, plus `logit_bias(tokens)`, this is the logit."""
        w, _, t, u = self._directions(tokens, incorrect_tokens, "logit_attrs")
        direction = w[t] if u is None else w[t] - w[u]
        scaled = self.apply_ln_to_stack(stack, None, add_bias=False)
        return (scaled * direction.to(scaled.dtype)).sum(-1)

    def logit_bias(self, tokens: int | torch.Tensor,
                   incorrect_tokens: int | torch.Tensor | None = None) -> torch.Tensor:
        """The part of the logit of `tokens` that no component carries: the final norm's bias
        through the unembedding, plus the unembedding's own bias ([B, T], or a scalar for one
        id). Zero for a norm and head without biases."""
        w, b, t, u = self._directions(tokens, incorrect_tokens, "logit_bias")
        spec = self.reading_norm(None)
        out = torch.zeros(t.shape, dtype=w.dtype, device=w.device)
        norm_bias = spec.bias if spec is not None else None
        if norm_bias is not None:
            direction = w[t] if u is None else w[t] - w[u]
            out = out + direction @ norm_bias.to(w.dtype)
        if b is not None:
            out = out + (b[t] if u is None else b[t] - b[u])
        return out
