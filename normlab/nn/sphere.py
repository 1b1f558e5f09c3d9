"""nGPT's pieces: the normalization onto the unit sphere, its learned scales and the matrices it
keeps normalized (Loshchilov et al. 2024, "nGPT: Normalized Transformer with Representation
Learning on the Hypersphere", arXiv 2410.01131; github NVIDIA/ngpt, model.py and train.py).

- `l2(x)`: `x / ||x||` over the last dimension, the authors' `Block.justnorm` (no epsilon).
- `SphereScale`: a learned vector stored as the authors store every scale of nGPT, a parameter
  starting at `scale` used as `param * (init / scale)` (times a constant `factor`), so that its
  effective value starts at `init * factor` while Adam moves the parameter at the size of
  `scale`. The eigen learning rates `a_A`, `a_M` (`attn_alpha`, `mlp_alpha`: init 0.05, scale
  1/sqrt(d)), `s_qk` (`sqk`: init 1, scale 1/sqrt(d)), `s_uv` (`suv`: init 1, scale 1, factor
  sqrt(d)) and `s_z` (`sz`: init 1, scale 1/sqrt(d)).
- `sphere_matrices(model)`: the matrices renormalized along the width d after every optimizer
  step (train.py, `normalize_matrices`): the token embedding and the head (each row), the attention
  projections (Q, K, V: each row; the output projection: each column), the MLP maps (the first:
  each row; the second: each column), and learned positions where the model has them.
  `renormalize_matrices` does it; `normlab.train.optim.adamw` calls it after each step, and
  `NormTransformer` once at init.
"""

from __future__ import annotations

import torch
from torch import nn


def l2(x: torch.Tensor) -> torch.Tensor:
    """`x / ||x||_2` over the last dimension (the authors' `justnorm`)."""
    return x / x.norm(p=2, dim=-1, keepdim=True)


def base_scale(d: int) -> float:
    """The authors' `base_scale`, `1/sqrt(d)` (train.py: `base_scale = 1.0 / n_embd ** 0.5`)."""
    return 1.0 / d ** 0.5


class SphereScale(nn.Module):
    """A learned vector of `size`, `weight * (init / scale) * factor`, `weight` starting at
    `scale` (see the module doc)."""

    def __init__(self, size: int, init: float, scale: float, factor: float | None = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.full((size,), scale))
        self.init, self.scale = init, scale
        # the authors' order of operations: (init / scale), then times the factor
        self.ratio = init / scale if factor is None else (init / scale) * factor

    def forward(self) -> torch.Tensor:
        return self.weight * self.ratio


def sphere_matrices(model: nn.Module) -> list[tuple[nn.Parameter, int]]:
    """The matrices of an nGPT `model` (`normlab.nn.NormTransformer` whose plan is on the sphere)
    and the dimension of each that is the width d, along which it is kept unit-norm; empty for
    any other model. Each matrix once (a tied head is the embedding)."""
    plan = getattr(model, "plan", None)
    if plan is None or not getattr(plan, "hypersphere", False):
        return []
    out: list[tuple[nn.Parameter, int]] = [(model.tok_emb.weight, 1)]
    if model.pos_emb is not None:
        out.append((model.pos_emb.weight, 1))
    head = getattr(model, "lm_head", None)
    if head is not None and head.weight is not model.tok_emb.weight:
        out.append((head.weight, 1))
    for block in model.blocks:
        attn, mlp = block.attn.fn, block.mlp.fn
        if hasattr(attn, "qkv"):  # `attention: none` has no weights
            out += [(attn.qkv.weight, 1), (attn.proj.weight, 0)]
        out += [(mlp.fc_in.weight, 1), (mlp.fc_out.weight, 0)]
    return out


@torch.no_grad()
def renormalize_(matrices: list[tuple[nn.Parameter, int]]) -> None:
    """Each matrix divided by its L2 norms along its width dimension, computed in float32 as the
    authors' train.py `justnorm(x, idim)` computes it, and stored back in its own dtype."""
    for w, dim in matrices:
        x = w.float()
        w.copy_((x / x.norm(p=2, dim=dim, keepdim=True)).to(w.dtype))


def renormalize_matrices(model: nn.Module) -> None:
    """`renormalize_(sphere_matrices(model))`: nothing for a model that is not nGPT."""
    renormalize_(sphere_matrices(model))
