"""The quantities the theory papers state at initialization, measured exactly as they state them.

    stats = init_statistics(model, batches)
    stats["per_block"]["sq_norm"]          # E||x_l||^2 after block l (l = 0..L-1), over tokens
    stats["summary"]["embed_sq"]           # E||x_0||^2 of the stream entering block 0

- `sq_norm`: the mean over tokens of the squared norm of the stream leaving each block (Xiong et
  al. 2020, Lemma 2, states `E||x_l||^2`; the general probes report the mean norm instead);
- `mlp_norm_input_sq`: the mean squared norm of `x + MLP(x)` at each MLP sublayer, the input of
  Post-LN's norm (Lemma 2: `3d/2`);
- `fc_out_grad`: the Frobenius norm of the gradient of each block's second MLP matrix `W^2`
  (Xiong's Theorem 1 bounds the last one's; Fig. 3 plots them by layer), from one backward pass
  of the mean loss over all batches;
- `final_in_sq`: `E||x_L||^2` of the stream entering the final norm;
- `attn_branch_sq`, `mlp_branch_sq`: `E||attn||^2` and `E||MLP||^2`, what each sublayer adds to
  the stream (its `branch_added` tap), and `attn_in_sq`, `mlp_in_sq`: the squared norm of the
  stream entering each: the quantities a source's mechanism is evaluated with on a block that
  is not the source's (Lemma 2's per-block increment is `E||attn||^2 + E||MLP||^2` at init,
  where the cross terms vanish; Admin's output change follows the sum of each branch's energy
  over its input's).

Squared norms are divided by nothing here: the study divides by `d` where a statement is in
units of `d`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from normlab.nn.taps import capture
from normlab.probe.measures import model_loss, token_norms

Batch = tuple[torch.Tensor, torch.Tensor]


def _mean_sq(x: torch.Tensor) -> float:
    """E||x||^2 over tokens."""
    return token_norms(x.double()).square().mean().item()


def init_statistics(model: nn.Module, batches: Sequence[Batch]) -> dict[str, object]:
    """`per_block` (sq_norm, mlp_norm_input_sq, fc_out_grad, the branch and input energies of
    each sublayer) and `summary` (embed_sq,
    final_in_sq, last_fc_out_grad, loss) of `model` on `batches` (see the module doc)."""
    if not batches:
        raise ValueError("init_statistics needs at least one batch")
    L = len(model.blocks)
    idx = torch.cat([b[0] for b in batches])
    targets = torch.cat([b[1] for b in batches])
    weights = [blk.mlp.fn.fc_out.weight for blk in model.blocks]
    was_training = model.training
    model.eval()
    taps = ["blocks.0.attn.stream_in", "final.input"]
    taps += [f"blocks.{i}.{k}.{t}" for i in range(L) for k in ("attn", "mlp")
             for t in ("stream_in", "branch_added")]
    taps += [f"blocks.{i}.mlp.stream_out" for i in range(L)]
    with capture(model, taps) as cap:
        loss = model_loss(model.cfg.kind, model(idx).logits, targets)
    grads = torch.autograd.grad(loss, weights, allow_unused=True)
    model.train(was_training)
    a = cap.activations
    fc = [0.0 if g is None else torch.linalg.vector_norm(g.double()).item() for g in grads]
    return {
        "per_block": {
            "sq_norm": [_mean_sq(a[f"blocks.{i}.mlp.stream_out"]) for i in range(L)],
            "mlp_norm_input_sq": [_mean_sq(a[f"blocks.{i}.mlp.stream_in"]
                                           + a[f"blocks.{i}.mlp.branch_added"])
                                  for i in range(L)],
            "fc_out_grad": fc,
            **{f"{k}_{t}_sq": [_mean_sq(a[f"blocks.{i}.{k}.{tap}"]) for i in range(L)]
               for k in ("attn", "mlp") for t, tap in (("branch", "branch_added"),
                                                        ("in", "stream_in"))},
        },
        "summary": {"embed_sq": _mean_sq(a["blocks.0.attn.stream_in"]),
                    "final_in_sq": _mean_sq(a["final.input"]), "last_fc_out_grad": fc[-1],
                    "loss": loss.item(), "d_model": model.cfg.d_model, "n_blocks": L},
    }
