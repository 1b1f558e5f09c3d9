"""Stream statistics per block (claims C1, C2 of docs/reference.md section 2).

For block `l` (0-based) with input `x_l` and output `x_{l+1}` (taps `blocks.{l}.attn.stream_in`
and `blocks.{l}.mlp.stream_out`), per batch:

    norm          mean over tokens of ||x_{l+1}||          (norm_attn: after the attention sublayer)
    rel_update    mean over tokens of ||x_{l+1} - x_l|| / ||x_l||
    cos_prev      mean over tokens of cos(x_l, x_{l+1});  ang_prev = angle / pi, in [0, 1]
    cos_last      the same between x_{l+1} and the last block's output x_L;  ang_last
    branch_attn   mean over tokens of ||branch added by attention|| / ||stream entering it||
    branch_mlp    the same for the MLP sublayer
    dual_norm     ResiDual and SiameseNorm only: mean token norm of the second stream d after
                  the block

Activations are reduced inside the hooks to per-token lengths (`[B, T]` per block), so a probe of
a 1000-block model holds no more than one block's stream at a time. Angles come from the three
lengths |a|, |b|, |a - b| by Kahan's stable formula, exact for identical streams. The cosine with
the last block needs the last stream: without gradients it takes a second, gradient-free forward
pass; with gradients (`normlab.probe.grads`) the block outputs, which autograd saves for the
backward anyway, are referenced until the forward ends and compared with the last one then.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from normlab.probe.hooks import eval_mode, hooked
from normlab.probe.measures import angle_from_sides, token_norms

Batch = tuple[torch.Tensor, torch.Tensor]


class StreamRecorder:
    """Forward hooks that reduce each block's stream to per-token lengths as the forward runs."""

    def __init__(self, model: nn.Module, *, hold: bool = False) -> None:
        self.n_blocks = len(model.blocks)
        self.hold = hold
        self.dual = bool(getattr(model.plan, "dual_stream", False))
        self.clear()

    def clear(self) -> None:
        L = self.n_blocks
        self.embed: torch.Tensor | None = None
        self.mid: list[torch.Tensor | None] = [None] * L  # ||x after attention||
        self.out: list[torch.Tensor | None] = [None] * L  # ||x_{l+1}||
        self.diff: list[torch.Tensor | None] = [None] * L  # ||x_{l+1} - x_l||
        self.ya: list[torch.Tensor | None] = [None] * L  # ||attention branch as added||
        self.ym: list[torch.Tensor | None] = [None] * L  # ||MLP branch as added||
        self.dual_n: list[torch.Tensor | None] = [None] * L
        self.final: torch.Tensor | None = None
        self.last: torch.Tensor | None = None  # x_L, kept for the second pass
        self.kept: list[torch.Tensor | None] = [None] * L  # hold=True: every x_{l+1}
        self._prev: torch.Tensor | None = None

    # -- hooks --------------------------------------------------------------------------------
    def hooks(self) -> dict[str, object]:
        table: dict[str, object] = {"blocks.0.attn.stream_in": self._embed_hook,
                                    "final.out": self._final_hook}
        for i in range(self.n_blocks):
            p = f"blocks.{i}"
            table[f"{p}.attn.branch_added"] = self._store("ya", i)
            table[f"{p}.attn.stream_out"] = self._store("mid", i)
            table[f"{p}.mlp.branch_added"] = self._store("ym", i)
            table[f"{p}.mlp.stream_out"] = self._out_hook(i)
            if self.dual:
                table[p] = self._dual_hook(i)
        return table

    def _embed_hook(self, _m, _inp, x) -> None:
        with torch.no_grad():
            self._prev = x
            self.embed = token_norms(x)

    def _final_hook(self, _m, _inp, x) -> None:
        with torch.no_grad():
            self.final = token_norms(x)

    def _store(self, where: str, i: int):
        def hook(_m, _inp, x) -> None:
            with torch.no_grad():
                getattr(self, where)[i] = token_norms(x)
        return hook

    def _out_hook(self, i: int):
        def hook(_m, _inp, x) -> None:
            with torch.no_grad():
                self.out[i] = token_norms(x)
                self.diff[i] = token_norms(x - self._prev)
                self._prev = x
                if self.hold:
                    self.kept[i] = x
                if i == self.n_blocks - 1:
                    self.last = x
        return hook

    def _dual_hook(self, i: int):
        def hook(_m, _args, out) -> None:  # a block returns (x, carry): carry.dual after it
            with torch.no_grad():
                self.dual_n[i] = token_norms(out[1].dual)
        return hook

    @torch.no_grad()
    def last_from_kept(self) -> list[torch.Tensor]:
        """`||x_{l+1} - x_L||` per token from the streams kept with `hold=True`; releases them.

        With gradients on, every block output is saved by autograd for the backward anyway (the
        next sublayer's norm or linear map saves its input), so holding references to them until
        the forward ends costs no memory; they are released before the backward starts.
        """
        last = self.kept[-1]
        diffs = [token_norms(x - last) for x in self.kept]
        self.kept = [None] * self.n_blocks
        self._prev = self.last = None
        return diffs

    # -- results ------------------------------------------------------------------------------
    def summary(self, last_diff: Sequence[torch.Tensor] | None = None) -> dict[str, object]:
        """Per-block numbers of the recorded forward; `last_diff[l] = ||x_{l+1} - x_L||` per
        token (from `last_pass`) adds the comparison with the last block."""
        out = torch.stack(self.out)  # [L, B, T]
        inp = torch.cat([self.embed[None], out[:-1]])
        diff = torch.stack(self.diff)
        mid = torch.stack(self.mid)
        angle = angle_from_sides(inp, out, diff)
        tiny = 1e-12
        res: dict[str, object] = {
            "embed_norm": self.embed.mean().item(),
            "final_norm": self.final.mean().item() if self.final is not None else math.nan,
            "norm": _mean(out), "norm_attn": _mean(mid),
            "rel_update": _mean(diff / inp.clamp_min(tiny)),
            "cos_prev": _mean(torch.cos(angle)), "ang_prev": _mean(angle / math.pi),
            "branch_attn": _mean(torch.stack(self.ya) / inp.clamp_min(tiny)),
            "branch_mlp": _mean(torch.stack(self.ym) / mid.clamp_min(tiny)),
        }
        if last_diff is not None:
            ang = angle_from_sides(out, out[-1:].expand_as(out), torch.stack(list(last_diff)))
            res["cos_last"], res["ang_last"] = _mean(torch.cos(ang)), _mean(ang / math.pi)
        if self.dual:
            res["dual_norm"] = _mean(torch.stack(self.dual_n))
        return res


def _mean(per_token: torch.Tensor) -> list[float]:
    """`[L, B, T]` -> per-block means over tokens, as floats."""
    return per_token.flatten(1).mean(1).tolist()


@torch.no_grad()
def last_pass(model: nn.Module, idx: torch.Tensor, last: torch.Tensor) -> list[torch.Tensor]:
    """Gradient-free forward that measures ||x_{l+1} - x_L|| per token for every block."""
    L = len(model.blocks)
    diffs: list[torch.Tensor | None] = [None] * L

    def make(i: int):
        def hook(_m, _inp, x) -> None:
            diffs[i] = token_norms(x - last)
        return hook

    with hooked(model, {f"blocks.{i}.mlp.stream_out": make(i) for i in range(L)}):
        model.stream(idx)
    return diffs  # type: ignore[return-value]


def average(per_batch: Sequence[dict[str, object]]) -> dict[str, object]:
    """Mean over batches of per-batch results (lists element-wise), plus `<key>_std` of every
    scalar over batches."""
    out: dict[str, object] = {}
    for key in per_batch[0]:
        values = [r[key] for r in per_batch]
        if isinstance(values[0], list):
            out[key] = torch.tensor(values, dtype=torch.float64).mean(0).tolist()
        elif isinstance(values[0], (int, float)):
            t = torch.tensor(values, dtype=torch.float64)
            out[key] = t.mean().item()
            out[f"{key}_std"] = t.std().item() if len(values) > 1 else 0.0
        else:
            out[key] = values[0]
    return out


def growth_exponent(norms: Sequence[float]) -> float:
    """Slope of log(norm after block l) against log(l), l = 1..L, by least squares: the stream
    norm grows like l**exponent (Xiong Lemma 2 at init: 0.5 for pre; 0 for post)."""
    if len(norms) < 2:
        return math.nan
    x = torch.log(torch.arange(1, len(norms) + 1, dtype=torch.float64))
    y = torch.log(torch.tensor(norms, dtype=torch.float64).clamp_min(1e-30))
    xc = x - x.mean()
    return ((xc * (y - y.mean())).sum() / (xc * xc).sum()).item()


def stream_stats(model: nn.Module, batches: Sequence[Batch]) -> dict[str, object]:
    """Stream statistics of `model` averaged over `batches` (no gradients). See the module doc."""
    rec = StreamRecorder(model)
    per_batch = []
    with eval_mode(model), torch.no_grad():
        for idx, _ in batches:
            rec.clear()
            with hooked(model, rec.hooks()):
                model.stream(idx)
            per_batch.append(rec.summary(last_pass(model, idx, rec.last)))
            rec.clear()
    res = average(per_batch)
    res["growth_exponent"] = growth_exponent(res["norm"])
    return res
