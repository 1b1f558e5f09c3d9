"""M models of one shape trained as one: every weight gets a leading member dimension.

`StackedTransformer(models)` takes M ordinary `NormTransformer`s built from the same
`ModelConfig` (different seeds give different weights) and keeps their Block / Sublayer modules,
swapping only the leaves for stacked versions whose parameters are `torch.stack` of the members':

    Linear      weight [M, out, in] (member i's slice is its nn.Linear weight), bias [M, out];
                over [M, B*T, in]: one GEMM per member on CPU (`_MemberGemms`), one baddbmm else
    LayerNorm / RMSNorm / DyT / Derf   weight, bias [M, d] (DyT's and Derf's alpha and Derf's
                shift [M]), broadcast as [M, 1, d]
    Embedding   weight [M, V, d]; a tied LM head shares it, as in the members
    HeadScale   weight [M, heads] (NormFormer), against the attention's [M*B, T, d]
    gate, skip  (Sublayer parameters) [M, 1, 1, 1] and [M, 1, 1, d], against the stream

The residual stream is [M, B, T, d]; attention sees [M*B, T, d] (members folded into the batch),
so every operation acts on each member's slice alone and a NaN in one member never reaches
another. The forward returns one loss per member; the sum's gradient is each member's own.
Parameter names are the members' names, so a member's weights are `member_tensors(i)`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from normlab.config import ModelConfig
from normlab.nn.layers import Attention, HeadScale
from normlab.nn.model import ModelOutput, NormTransformer
from normlab.nn.norms import Derf, DyT
from normlab.nn.taps import Tap


def unstackable_reason(cfg: ModelConfig) -> str | None:
    """Why models of `cfg` cannot be stacked, or None when they can."""
    if cfg.kind != "decoder":
        return "kind=encoder (stacking supports decoders)"
    if cfg.dropout > 0:
        return f"dropout={cfg.dropout} (members would need their own dropout masks)"
    if "batchnorm" in (cfg.norm, cfg.out_norm):
        return "batchnorm (running statistics are not stacked)"
    if cfg.placement == "ngpt":
        return ("placement=ngpt (its scales s_qk, s_uv, s_z and eigen learning rates are not "
                "stacked, nor is its renormalization of the matrices after each step)")
    return None


class _MemberGemms(torch.autograd.Function):
    """`h[i] @ weight[i].T + bias[i]` for each member i as one GEMM per member, forward and
    backward. On CPU this is up to 2x faster than one `torch.bmm` for wide outputs (measured at
    [8, 2048, 128] x [128, 512]: 8 ms vs 16 ms), and never much slower."""

    @staticmethod
    def forward(ctx, h, weight, bias):
        ctx.save_for_backward(h, weight)
        ctx.has_bias = bias is not None
        out = h.new_empty(h.shape[0], h.shape[1], weight.shape[1])
        for i in range(h.shape[0]):
            if bias is None:
                torch.mm(h[i], weight[i].t(), out=out[i])
            else:
                torch.addmm(bias[i], h[i], weight[i].t(), out=out[i])
        return out

    @staticmethod
    def backward(ctx, grad):
        h, weight = ctx.saved_tensors
        grad_h = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_h = h.new_empty(h.shape)
            for i in range(h.shape[0]):
                torch.mm(grad[i], weight[i], out=grad_h[i])
        if ctx.needs_input_grad[1]:
            grad_w = weight.new_empty(weight.shape)
            for i in range(h.shape[0]):
                torch.mm(grad[i].t(), h[i], out=grad_w[i])
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = grad.sum(1)
        return grad_h, grad_w, grad_b


class StackedLinear(nn.Module):
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight)
        self.bias = nn.Parameter(bias) if bias is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = self.weight.shape[0]
        h = x.reshape(m, -1, x.shape[-1])
        if x.device.type == "cpu" and not torch.is_autocast_enabled("cpu"):
            y = _MemberGemms.apply(h, self.weight, self.bias)
        else:  # one batched kernel (GPU; bf16 autocast casts its inputs)
            w = self.weight.transpose(1, 2)
            y = (torch.bmm(h, w) if self.bias is None
                 else torch.baddbmm(self.bias.unsqueeze(1), h, w))
        return y.view(*x.shape[:-1], y.shape[-1])


class StackedNorm(nn.Module):
    """LayerNorm, RMSNorm, DyT or Derf with per-member affine parameters; inputs are
    member-major ([M, ...] or [M*B, ...]) and normalized over the last dimension."""

    def __init__(self, kind: str, weight: torch.Tensor | None, bias: torch.Tensor | None,
                 eps: float | None = None, alpha: torch.Tensor | None = None,
                 shift: torch.Tensor | None = None) -> None:
        super().__init__()
        self.kind, self.eps = kind, eps
        self.alpha = nn.Parameter(alpha) if alpha is not None else None
        self.shift = nn.Parameter(shift) if shift is not None else None
        self.weight = nn.Parameter(weight) if weight is not None else None
        self.bias = nn.Parameter(bias) if bias is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1]
        h = x.reshape(self.members, -1, d)
        if self.kind == "layernorm":
            h = F.layer_norm(h, (d,), eps=self.eps)
        elif self.kind == "rmsnorm":
            h = F.rms_norm(h, (d,), eps=self.eps)
        elif self.kind == "derf":
            h = torch.erf(self.alpha.view(-1, 1, 1) * h + self.shift.view(-1, 1, 1))
        else:
            h = torch.tanh(self.alpha.view(-1, 1, 1) * h)
        if self.weight is not None:
            h = (h * self.weight.unsqueeze(1) if self.bias is None
                 else torch.addcmul(self.bias.unsqueeze(1), h, self.weight.unsqueeze(1)))
        return h.view(x.shape)

    @property
    def members(self) -> int:
        return (self.weight if self.weight is not None else self.alpha).shape[0]


class StackedEmbedding(nn.Module):
    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """idx [M, ...] -> [M, ..., d], member i looking up its own table."""
        m, v, d = self.weight.shape
        offsets = (torch.arange(m, device=idx.device) * v).view(-1, *([1] * (idx.dim() - 1)))
        return F.embedding(idx + offsets, self.weight.reshape(m * v, d))


class StackedHeadScale(nn.Module):
    """NormFormer's head scale with per-member factors [M, heads]; inputs are member-major
    ([M*B, T, d], as attention sees them) and viewed as [..., heads, d/heads]."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m, h = self.weight.shape
        y = x.reshape(m, -1, h, x.shape[-1] // h) * self.weight[:, None, :, None]
        return y.view(x.shape)


def _stack(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.stack([t.detach() for t in tensors])


def _stacked_leaf(mods: Sequence[nn.Module], tied: dict[int, nn.Parameter]) -> nn.Module | None:
    """The stacked version of one leaf module taken from every member, or None if it has no
    parameters to stack (Identity, Tap, Dropout)."""
    first = mods[0]
    if isinstance(first, nn.Linear):
        out = StackedLinear(_stack([m.weight for m in mods]),
                            _stack([m.bias for m in mods]) if first.bias is not None else None)
    elif isinstance(first, nn.Embedding):
        out = StackedEmbedding(_stack([m.weight for m in mods]))
    elif isinstance(first, nn.LayerNorm | nn.RMSNorm):
        kind = "layernorm" if isinstance(first, nn.LayerNorm) else "rmsnorm"
        weight = _stack([m.weight for m in mods]) if first.weight is not None else None
        bias = (_stack([m.bias for m in mods]) if getattr(first, "bias", None) is not None
                else None)
        out = StackedNorm(kind, weight, bias, eps=first.eps)
    elif isinstance(first, HeadScale):
        out = StackedHeadScale(_stack([m.weight for m in mods]))
    elif isinstance(first, DyT):
        out = StackedNorm("dyt", _stack([m.weight for m in mods]),
                          _stack([m.bias for m in mods]) if first.bias is not None else None,
                          alpha=_stack([m.alpha for m in mods]))
    elif isinstance(first, Derf):
        out = StackedNorm("derf", _stack([m.weight for m in mods]),
                          _stack([m.bias for m in mods]) if first.bias is not None else None,
                          alpha=_stack([m.alpha for m in mods]),
                          shift=_stack([m.shift for m in mods]))
    elif any(True for _ in first.parameters(recurse=False)):
        raise TypeError(f"cannot stack a {type(first).__name__}")
    else:
        return None
    # A weight shared between modules of a member (tied embeddings) stays shared.
    for name, p in first.named_parameters(recurse=False):
        if id(p) in tied:
            setattr(out, name, tied[id(p)])
        else:
            tied[id(p)] = getattr(out, name)
    return out


def _fold_members(module: nn.Module, args: tuple) -> tuple:
    x, *rest = args  # the context and RealFormer's scores, already [M*B, ...], pass as they are
    return (x.flatten(0, 1), *rest)  # [M, B, T, d] -> [M*B, T, d]


def _unfold_members(module: Attention, args: tuple, out: tuple) -> tuple:
    y, scores = out
    return y.unflatten(0, (module.proj.weight.shape[0], -1)), scores


class StackedTransformer(NormTransformer):
    """M same-shape decoders as one module: `forward(idx [M,B,T], targets [M,B,T])` returns
    logits [M, B, T, V] and the loss of each member, [M]."""

    def __init__(self, models: Sequence[NormTransformer]) -> None:
        cfgs = {m.cfg for m in models}
        if not models or len(cfgs) != 1:
            raise ValueError("StackedTransformer needs at least one model, all of one ModelConfig")
        reason = unstackable_reason(models[0].cfg)
        if reason:
            raise ValueError(f"cannot stack these models: {reason}")
        # The members' modules are adopted, not rebuilt: NormTransformer.__init__ would build and
        # initialize a fresh model only to replace its weights.
        nn.Module.__init__(self)
        base = models[0]
        self.cfg, self.plan = base.cfg, base.plan
        self.shapes = {name: tuple(p.shape) for name, p in base.named_parameters()}
        for name, child in base.named_children():
            self.add_module(name, child)
        for name in ("pos_emb", "embed_norm"):  # absent (RoPE; no norm): None, not a child
            if getattr(base, name) is None:
                setattr(self, name, None)
        for name, buf in base.named_buffers(recurse=False):
            self.register_buffer(name, buf, persistent=False)

        tied: dict[int, nn.Parameter] = {}
        member_modules = [dict(m.named_modules()) for m in models]
        for name, module in list(self.named_modules()):
            if name == "":
                continue
            mods = [mm[name] for mm in member_modules]
            # a norm's only children are its taps: a leaf (the stacked norm has no taps)
            if all(isinstance(c, Tap) for c in module.children()):
                stacked = _stacked_leaf(mods, tied)
                if stacked is not None:
                    parent, _, attr = name.rpartition(".")
                    setattr(self.get_submodule(parent) if parent else self, attr, stacked)
                continue
            for pname, p in list(module.named_parameters(recurse=False)):
                # Sublayer's gate (scalar) and skip ([d]) broadcast against the [M, B, T, d]
                # stream.
                value = _stack([getattr(m, pname) for m in mods])
                value = value.view(len(models), *([1] * (3 - p.dim())), *p.shape)
                setattr(module, pname, nn.Parameter(value))
            if isinstance(module, Attention):
                module.register_forward_pre_hook(_fold_members)
                module.register_forward_hook(_unfold_members)

    @property
    def members(self) -> int:
        """How many models the stack holds now (the optimizer may drop some)."""
        return self.tok_emb.weight.shape[0]

    def _positions(self, length: int) -> torch.Tensor:
        return self.pos_emb.weight[:, None, :length]  # [M, 1, T, d] against [M, B, T, d]

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None) -> ModelOutput:
        if attention_mask is not None:
            raise ValueError("a stacked model takes no attention_mask (decoders only)")
        if idx.dim() != 3 or idx.shape[0] != self.members:
            raise ValueError(f"idx: expected [members={self.members}, batch, seq], got "
                             f"{list(idx.shape)}")
        logits = self.lm_head(self.stream(idx))
        loss = None
        if targets is not None:
            per_token = F.cross_entropy(logits.flatten(0, 2).float(), targets.flatten(),
                                        ignore_index=-100, reduction="none").view(self.members, -1)
            counted = (targets.view(self.members, -1) != -100).sum(1).clamp_min(1)
            loss = per_token.sum(1) / counted
        return ModelOutput(logits, loss)

    def member_tensors(self, i: int) -> dict[str, torch.Tensor]:
        """Member i's parameters, named and shaped as in its own `NormTransformer`."""
        return {name: p.detach()[i].reshape(self.shapes[name])
                for name, p in self.named_parameters()}

    def num_params(self) -> int:
        return sum(math.prod(s) for s in self.shapes.values())
