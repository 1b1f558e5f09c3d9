"""AdamW for a `StackedTransformer` (or a module built on one, as fine-tuning's stacked
classifier, `normlab.finetune.loop`: any module with `members` and the member-shaped `shapes` of
its parameters): the members' weights and moments in one buffer each.

All parameters live in one `[M, P]` buffer (member i's row holds its P weights; decayed weight
matrices first), and each stacked parameter is a view into it. Gradients are gathered into the
same layout, so the gradient norm of each member and its clipping are one operation on `[M, P]`
tensors (per-member factors as an `[M, 1]` column). The update is torch's fused AdamW kernel
(what a run alone trains with, `torch.optim.AdamW(fused=True)`) over the members' rows: one call
per distinct setting of (learning rate, betas, eps, weight decay) and column group, each call over
the rows of every member with that setting and each row at its own step count. The kernel updates
each tensor of its list on its own, so a row gets exactly the arithmetic it would get in a call
of its own: an lr x seed grid of 64 members makes 2 calls per lr on each step, not 128, and on a
GPU each call is one multi-tensor launch. Clipping is `torch.nn.utils.clip_grads_with_norm_`'s, so
a member trains as it would alone.

Members can be dropped (`keep`): a diverged or finished member leaves the stack and the others
continue without it. `set_weights` puts rows of weights back (members that left at different
steps, gathered again to be evaluated together).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn


class StackedAdamW:
    def __init__(self, model: nn.Module, decayed: set[str],
                 states: Sequence[dict[str, dict[str, torch.Tensor]]] | None = None) -> None:
        """`decayed`: names of the parameters with weight decay (the trainer's `param_groups`
        rule). `states`: each member's AdamW state by parameter name (`exp_avg`, `exp_avg_sq`,
        `step`), as a resumed checkpoint holds it; missing: a fresh optimizer."""
        self.model = model
        named = dict(model.named_parameters())
        self.names = sorted(named, key=lambda n: n not in decayed)  # stable: decayed first
        self.params = [named[n] for n in self.names]
        self.sizes = [math.prod(model.shapes[n]) for n in self.names]
        self.n_decayed = sum(s for n, s in zip(self.names, self.sizes, strict=True)
                             if n in decayed)
        m = model.members
        self.flat = torch.cat([p.detach().reshape(m, -1) for p in self.params], dim=1)
        self.exp_avg = torch.zeros_like(self.flat)
        self.exp_avg_sq = torch.zeros_like(self.flat)
        self.steps = [0] * m
        for i, state in enumerate(states or []):
            if state:
                self.exp_avg[i] = self._row(state, "exp_avg")
                self.exp_avg_sq[i] = self._row(state, "exp_avg_sq")
                self.steps[i] = int(next(iter(state.values()))["step"].item())
        self._repoint()

    def _row(self, state: dict[str, dict[str, torch.Tensor]], slot: str) -> torch.Tensor:
        return torch.cat([state[n][slot].reshape(-1).to(self.flat) for n in self.names])

    def _repoint(self) -> None:
        """Make every model parameter a view of its columns of `flat`."""
        offset = 0
        for p, size in zip(self.params, self.sizes, strict=True):
            p.data = self.flat[:, offset:offset + size].view(self.flat.shape[0], *p.shape[1:])
            offset += size

    # -- one step ---------------------------------------------------------------------------------
    def gather_grads(self) -> torch.Tensor:
        """The members' gradients as one [M, P] tensor (zeros where a parameter got none)."""
        m = self.flat.shape[0]
        return torch.cat([p.grad.reshape(m, -1) if p.grad is not None
                          else torch.zeros(m, s, device=self.flat.device, dtype=self.flat.dtype)
                          for p, s in zip(self.params, self.sizes, strict=True)], dim=1)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def _column(self, values: Sequence[float]) -> torch.Tensor:
        # computed in float64 like torch's Python-float hyperparameters, then cast like them
        return torch.tensor(values, dtype=torch.float64).to(self.flat).view(-1, 1)

    @torch.no_grad()
    def clip_(self, grads: torch.Tensor, norms: Sequence[float],
              max_norms: Sequence[float | None]) -> None:
        """Scale each member's gradient (norm `norms[i]`) to at most its max norm (None: no
        clipping)."""
        coef = [1.0 if mx is None else min(1.0, mx / (n + 1e-6))
                for mx, n in zip(max_norms, norms, strict=True)]
        if any(c != 1.0 for c in coef):
            grads.mul_(self._column(coef))

    @torch.no_grad()
    def step(self, grads: torch.Tensor, hp: Sequence[dict[str, Any]]) -> None:
        """One AdamW step of every member; `hp[i]`: member i's lr, weight_decay, beta1, beta2,
        eps (`normlab.train.optim.adamw_hyper`). Members that share a setting share a call of
        the fused kernel; each keeps its own step count."""
        self.steps = [s + 1 for s in self.steps]
        step = torch.tensor(self.steps, dtype=torch.float32, device=self.flat.device)
        n, total = self.n_decayed, self.flat.shape[1]
        parts = [(slice(0, n), True)] * (n > 0) + [(slice(n, total), False)] * (total > n)
        for cols, decayed in parts:
            for (lr, beta1, beta2, eps, weight_decay), rows in _same_setting(hp, decayed).items():
                torch._fused_adamw_(
                    [self.flat[i, cols] for i in rows], [grads[i, cols] for i in rows],
                    [self.exp_avg[i, cols] for i in rows],
                    [self.exp_avg_sq[i, cols] for i in rows], [], [step[i] for i in rows],
                    amsgrad=False, maximize=False, lr=lr, beta1=beta1, beta2=beta2, eps=eps,
                    weight_decay=weight_decay)

    # -- members ----------------------------------------------------------------------------------
    def keep(self, rows: Sequence[int]) -> None:
        """Keep only these members (rows, in this order); the model shrinks with them."""
        index = torch.tensor(list(rows), dtype=torch.long, device=self.flat.device)
        self.flat = self.flat.index_select(0, index)
        self.exp_avg = self.exp_avg.index_select(0, index)
        self.exp_avg_sq = self.exp_avg_sq.index_select(0, index)
        self.steps = [self.steps[r] for r in rows]
        self.zero_grad()
        self._repoint()

    def set_weights(self, flat: torch.Tensor) -> None:
        """Make the model hold these members' weights (`flat`: [members, P], rows laid out as
        `flat`'s, e.g. rows saved as members left), with fresh moments and step counts."""
        self.flat = flat.to(self.flat)
        self.exp_avg = torch.zeros_like(self.flat)
        self.exp_avg_sq = torch.zeros_like(self.flat)
        self.steps = [0] * flat.shape[0]
        self.zero_grad()
        self._repoint()

    def member_state(self, i: int) -> dict[str, dict[str, torch.Tensor]]:
        """Member i's AdamW state by parameter name, shaped as `torch.optim.AdamW` keeps it."""
        out: dict[str, dict[str, torch.Tensor]] = {}
        offset = 0
        for name, size in zip(self.names, self.sizes, strict=True):
            shape = self.model.shapes[name]
            cols = slice(offset, offset + size)
            out[name] = {"step": torch.tensor(float(self.steps[i]), dtype=torch.float32),
                         "exp_avg": self.exp_avg[i, cols].reshape(shape).clone(),
                         "exp_avg_sq": self.exp_avg_sq[i, cols].reshape(shape).clone()}
            offset += size
        return out


def _same_setting(hp: Sequence[dict[str, Any]], decayed: bool
                  ) -> dict[tuple[float, ...], list[int]]:
    """The members (rows) of each distinct (lr, beta1, beta2, eps, weight decay) of this step;
    weight decay is 0 on the undecayed columns, so there members differing only in it share."""
    rows: dict[tuple[float, ...], list[int]] = {}
    for i, h in enumerate(hp):
        key = (h["lr"], h["beta1"], h["beta2"], h["eps"], h["weight_decay"] if decayed else 0.0)
        rows.setdefault(key, []).append(i)
    return rows
