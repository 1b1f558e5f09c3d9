"""Interventions through hooks (claim C3, docs/reference.md section 2): merge test and layer drop.

Merge test, for t = 0..L-2: block t+1's sublayers read block t's branch inputs instead of their
own. Forward hooks on `blocks.{t+1}.{attn,mlp}.branch_in` return the values captured at
`blocks.{t}.{attn,mlp}.branch_in` in the same forward pass, so for pre-norm block t+1 computes
`F_{t+1}(Norm(x_t))` in place of `F_{t+1}(Norm(x_{t+1}))`: blocks t and t+1 act as one wider block
on the same input. Reported: `merge_dloss[t]` = loss(merged) - loss(original) and
`merge_kl[t]` = KL(original || merged) of the output distribution (nats, mean over positions).

Layer drop, for t = 0..L-1: block t returns its inputs (a forward hook on the Block), the stream
and the carry (ResiDual's second stream, RealFormer's attention scores) as they came in, so the
dropped block leaves no trace (B2T's block input never leaves the block). Reported:
`drop_dloss[t]`, `drop_kl[t]`.

The per-batch rows (`*_per_batch`) are kept: the effective-depth summary needs their spread.

Skip effects (Csordás, Manning and Potts 2025, "Do Language Models Use Their Depth
Efficiently?", arXiv 2505.13898, Sec. 3 and Figs. 2a, 3), with block l's contribution
`c_l = a_l + m_l`, the sum of its two sublayers' branches as added (taps
`blocks.{l}.{attn,mlp}.branch_added`; the paper's attention and MLP outputs of a pre-norm
`h_{l+1} = h_l + a_l + m_l`), and `x_l` the stream entering the block (tap
`blocks.{l}.attn.stream_in`, the paper's `h_l`):

    rel_contribution[l]   mean over tokens of ||c_l|| / ||x_l||, the paper's relative contribution
                          ||a_l + m_l|| / ||h_l|| (its Fig. 2a, "mean relative contribution")
    skip_effect[i][j]     block i skipped (`drop_hooks(i)`, as layer drop): the largest over
                          tokens of ||c'_j - c_j|| / max(||c_j||, 1e-6), the relative change of
                          block j's contribution; 0 for j < i (they run as before), 1 at j = i
                          (its contribution is removed), measured for j > i (the paper's Fig. 3)
    skip_output[i]        the largest over tokens of ||p' - p||, the L2 norm of the change of the
                          output distribution (softmax of the logits) when block i is skipped

The paper's code (`analyze_norms.py`, `analyze_future_effects.py` of the authors' repository)
takes the relative change per token as `(orig - new).norm(-1) / orig.norm(-1).clamp(min=1e-6)`,
the maximum over positions and then over prompts ("the maximum effect", since a layer may
matter for a few tokens only), and the output change as the L2 norm of the difference of the
softmax outputs, also maximised over positions; here the maxima run over every token of every
batch. Two differences: the paper skips a layer at every position but the first (a BOS token
normlab's data does not have), normlab at every position; and a contribution here is what the
sublayers add (after any output norm or gate), which is also what the paper's difference of
residual streams is wherever the stream is the sum of the contributions (pre-norm). ResiDual's
blocks add `c_l` to both streams; a skipped block leaves both as they came in.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from normlab.probe.hooks import eval_mode, hooked
from normlab.probe.measures import TINY, kl_divergence, model_loss, token_norms

Batch = tuple[torch.Tensor, torch.Tensor]


def _outputs(model: nn.Module, idx: torch.Tensor, targets: torch.Tensor
             ) -> tuple[torch.Tensor, float]:
    logits = model(idx).logits
    return logits, model_loss(model.cfg.kind, logits, targets).item()


def merge_hooks(t: int) -> dict[str, object]:
    """Hooks that make block t+1's sublayers read block t's branch inputs (see module doc)."""
    saved: dict[str, torch.Tensor] = {}

    def keep(kind: str):
        def hook(_m, _inp, h) -> None:
            saved[kind] = h
        return hook

    def replace(kind: str):
        def hook(_m, _inp, _h) -> torch.Tensor:
            return saved[kind]
        return hook

    table: dict[str, object] = {}
    for kind in ("attn", "mlp"):
        table[f"blocks.{t}.{kind}.branch_in"] = keep(kind)
        table[f"blocks.{t + 1}.{kind}.branch_in"] = replace(kind)
    return table


def drop_hooks(t: int) -> dict[str, object]:
    """The forward hook that makes block t return its inputs `(x, carry)` in place of its
    output (`normlab.nn.block`: a block maps `(x, carry, ctx)` to `(x, carry)`)."""

    def forward(_m, args, _out) -> tuple:
        return args[0], args[1]

    return {f"blocks.{t}": forward}


@torch.no_grad()
def merge_test(model: nn.Module, batches: Sequence[Batch]) -> dict[str, object]:
    """Merge test for every consecutive pair of blocks, averaged over batches."""
    pairs = range(len(model.blocks) - 1)
    return _scan(model, batches, "merge", [(merge_hooks(t), None) for t in pairs])


@torch.no_grad()
def layer_drop(model: nn.Module, batches: Sequence[Batch]) -> dict[str, object]:
    """Loss increase and KL(original || dropped) when each block is skipped, over batches."""
    return _scan(model, batches, "drop",
                 [(drop_hooks(t), None) for t in range(len(model.blocks))])


def _scan(model: nn.Module, batches: Sequence[Batch], prefix: str,
          interventions: list[tuple[dict, dict | None]]) -> dict[str, object]:
    """Loss change and KL(original || intervened) of each (forward hooks, pre-hooks) pair."""
    dloss, kl = [], []
    with eval_mode(model):
        for idx, targets in batches:
            base, base_loss = _outputs(model, idx, targets)
            row_l, row_k = [], []
            for fwd, pre in interventions:
                with hooked(model, fwd, pre):
                    logits, loss = _outputs(model, idx, targets)
                row_l.append(loss - base_loss)
                row_k.append(kl_divergence(base, logits))
            dloss.append(row_l)
            kl.append(row_k)
    return _rows(prefix, dloss, kl)


def _rows(prefix: str, dloss: list[list[float]], kl: list[list[float]]) -> dict[str, object]:
    def mean(rows: list[list[float]]) -> list[float]:
        if not rows or not rows[0]:
            return []
        return torch.tensor(rows, dtype=torch.float64).mean(0).tolist()

    return {f"{prefix}_dloss": mean(dloss), f"{prefix}_kl": mean(kl),
            f"{prefix}_dloss_per_batch": dloss, f"{prefix}_kl_per_batch": kl}


SKIP_EPS = 1e-6  # the paper's clamp of a contribution's norm in `skip_effect`


def contribution_hooks(n_blocks: int, sink) -> dict[str, object]:
    """Forward hooks that call `sink(l, c_l, x_l)` for every block as the forward runs: its
    contribution `c_l` (the attention and MLP branches as added, summed) and the stream `x_l`
    entering it. Only one block's branch is held between two hooks."""
    stream: dict[int, torch.Tensor] = {}
    attn: dict[int, torch.Tensor] = {}

    def keep(where: dict[int, torch.Tensor], i: int):
        def hook(_m, _inp, h) -> None:
            where[i] = h
        return hook

    def done(i: int):
        def hook(_m, _inp, y_mlp) -> None:
            sink(i, attn.pop(i) + y_mlp, stream.pop(i))
        return hook

    table: dict[str, object] = {}
    for i in range(n_blocks):
        table[f"blocks.{i}.attn.stream_in"] = keep(stream, i)
        table[f"blocks.{i}.attn.branch_added"] = keep(attn, i)
        table[f"blocks.{i}.mlp.branch_added"] = done(i)
    return table


def _probabilities(model: nn.Module, idx: torch.Tensor) -> torch.Tensor:
    return torch.softmax(model(idx).logits.float(), dim=-1)


@torch.no_grad()
def skip_effect(model: nn.Module, batches: Sequence[Batch]) -> dict[str, object]:
    """The skip-effect matrix, the output change and the relative contribution of every block
    (see the module doc): one forward per batch, then one per skipped block."""
    L = len(model.blocks)
    effect = torch.zeros(L, L, dtype=torch.float64)
    output = torch.zeros(L, dtype=torch.float64)
    rel = torch.zeros(L, dtype=torch.float64)
    with eval_mode(model):
        for idx, _ in batches:
            e, o, r = _skip_batch(model, idx)
            effect, output, rel = torch.maximum(effect, e), torch.maximum(output, o), rel + r
    later = [effect[i, i + 1:].max().item() if i + 1 < L else float("nan") for i in range(L)]
    return {"skip_effect": effect.tolist(), "skip_effect_later": later,
            "skip_output": output.tolist(), "rel_contribution": (rel / len(batches)).tolist()}


def _skip_batch(model: nn.Module, idx: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One batch's skip-effect matrix [L, L], output changes [L] and relative contributions
    [L] (the mean over its tokens), on the CPU; the numbers stay on the model's device until
    each forward ends."""
    L = len(model.blocks)
    device = next(model.parameters()).device
    base: list[torch.Tensor | None] = [None] * L
    base_norm: list[torch.Tensor | None] = [None] * L
    rel = torch.zeros(L, dtype=torch.float64, device=device)

    def record(j: int, c: torch.Tensor, x: torch.Tensor) -> None:
        base[j], base_norm[j] = c, token_norms(c)
        rel[j] = (base_norm[j] / token_norms(x).clamp_min(TINY)).mean()

    with hooked(model, contribution_hooks(L, record)):
        p = _probabilities(model, idx)
    effect = torch.zeros(L, L, dtype=torch.float64, device=device)
    output = torch.zeros(L, dtype=torch.float64, device=device)
    for i in range(L):
        def compare(j: int, c: torch.Tensor, _x: torch.Tensor, i: int = i) -> None:
            # the skipped block still runs (its output is then replaced by its input): its
            # contribution to the stream is removed, c'_i = 0
            change = base_norm[j] if j == i else token_norms(c - base[j])
            effect[i, j] = (change / base_norm[j].clamp_min(SKIP_EPS)).max()

        with hooked(model, {**drop_hooks(i), **contribution_hooks(L, compare)}):
            q = _probabilities(model, idx)
        output[i] = token_norms(q - p).max()
    return effect.cpu(), output.cpu(), rel.cpu()
