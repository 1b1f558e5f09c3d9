"""Gradient statistics per block (claims C4, C5 of docs/reference.md section 2).

Per batch, from one backward pass of the model's own loss:

    attn_grad, mlp_grad   Frobenius norm of the gradient of all parameters of block l's attention
                          (MLP) sublayer: the branch's weights and biases plus its norms, gate and
                          skip weights
    stream_grad           Frobenius norm over the batch of dLoss/dx_{l+1}, the gradient at the
                          block's output stream (tap `blocks.{l}.mlp.stream_out`)
    last_fc_out_grad      Frobenius norm of the gradient of the last MLP's output weight,
                          `blocks.{L-1}.mlp.fn.fc_out.weight` (Xiong et al. 2020, Theorem 1:
                          flat in L for post, ~ L^-1/2 for pre, at Xavier init)
    embed_grad, head_grad, total_grad   the rest of the model, for scale (no head_grad
                          when the head is tied to the embedding: it is inside embed_grad)

Gradients come from `torch.autograd.grad`, so the parameters' `.grad` are left untouched, and all
parameter norms are taken in one fused `_foreach_norm` call.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from normlab.probe.hooks import eval_mode, hooked
from normlab.probe.measures import model_loss
from normlab.probe.stream import StreamRecorder, average, growth_exponent, stream_stats

Batch = tuple[torch.Tensor, torch.Tensor]


class GradRecorder:
    """Tensor hooks on each block's output stream and the parameter grouping by sublayer."""

    def __init__(self, model: nn.Module) -> None:
        self.n_blocks = L = len(model.blocks)
        self.params: list[torch.Tensor] = []
        groups: list[int] = []  # 2*l attention, 2*l+1 MLP, 2L embeddings, 2L+1 head, 2L+2 rest
        self.last_fc_out = -1
        last_name = f"blocks.{L - 1}.mlp.fn.fc_out.weight"
        for name, p in model.named_parameters():  # tied weights are listed once
            if not p.requires_grad:
                continue
            parts = name.split(".")
            if parts[0] == "blocks":
                g = 2 * int(parts[1]) + (0 if parts[2] == "attn" else 1)
            elif "emb" in parts[0]:
                g = 2 * L
            elif parts[0] in ("lm_head", "classifier"):
                g = 2 * L + 1
            else:
                g = 2 * L + 2
            if name == last_name:
                self.last_fc_out = len(self.params)
            self.params.append(p)
            groups.append(g)
        self.groups = torch.tensor(groups)
        self.has_head = 2 * L + 1 in groups
        self.stream: list[torch.Tensor | None] = [None] * L

    def hooks(self) -> dict[str, object]:
        return {f"blocks.{i}.mlp.stream_out": self._stream_hook(i) for i in range(self.n_blocks)}

    def _stream_hook(self, i: int):
        def grad_hook(g: torch.Tensor) -> None:
            self.stream[i] = torch.linalg.vector_norm(g)

        def hook(_m, _inp, x) -> None:
            if x.requires_grad:
                x.register_hook(grad_hook)
        return hook

    def backward(self, loss: torch.Tensor) -> dict[str, object]:
        grads = torch.autograd.grad(loss, self.params, allow_unused=True)
        grads = [torch.zeros_like(p) if g is None else g for p, g in
                 zip(self.params, grads, strict=True)]
        norms = torch.stack(torch._foreach_norm(grads)).double()
        del grads
        L = self.n_blocks
        # on the device the norms were computed on (the model's): one transfer per list below
        by_group = torch.zeros(2 * L + 3, dtype=torch.float64, device=norms.device).index_add_(
            0, self.groups.to(norms.device), norms * norms).sqrt()
        res: dict[str, object] = {
            "loss": loss.item(),
            "attn_grad": by_group[0:2 * L:2].tolist(),
            "mlp_grad": by_group[1:2 * L:2].tolist(),
            "stream_grad": [float("nan") if s is None else s.item() for s in self.stream],
            "last_fc_out_grad": norms[self.last_fc_out].item() if self.last_fc_out >= 0
            else float("nan"),
            "embed_grad": by_group[2 * L].item(),
            "total_grad": norms.square().sum().sqrt().item(),
        }
        if self.has_head:  # a head tied to the embedding has no weight of its own
            res["head_grad"] = by_group[2 * L + 1].item()
        self.stream = [None] * L
        return res


def stream_and_grad_stats(model: nn.Module, batches: Sequence[Batch], *, stream: bool = True,
                          grads: bool = True) -> dict[str, object]:
    """Stream and gradient statistics from one forward+backward per batch, averaged over
    batches. With `grads=False` this is `stream_stats` (gradient-free forwards)."""
    if not grads:
        return stream_stats(model, batches)
    srec = StreamRecorder(model, hold=True) if stream else None
    grec = GradRecorder(model)
    table: dict[str, list] = {}
    for rec in (srec, grec):
        if rec is not None:
            for k, v in rec.hooks().items():
                table.setdefault(k, []).append(v)
    kind = model.cfg.kind
    per_batch = []
    with eval_mode(model), torch.enable_grad(), hooked(model, table):
        for idx, targets in batches:
            if srec is not None:
                srec.clear()
            loss = model_loss(kind, model(idx).logits, targets)
            last_diff = srec.last_from_kept() if srec is not None else None
            res = grec.backward(loss)
            del loss
            if srec is not None:
                res.update(srec.summary(last_diff))
                srec.clear()
            per_batch.append(res)
    out = average(per_batch)
    if srec is not None:
        out["growth_exponent"] = growth_exponent(out["norm"])
    return out


def grad_stats(model: nn.Module, batches: Sequence[Batch]) -> dict[str, object]:
    """Gradient statistics alone (see the module doc), averaged over batches."""
    return stream_and_grad_stats(model, batches, stream=False)
