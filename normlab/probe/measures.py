"""The arithmetic of the probes: token norms, cosines, angular distance, loss and KL.

Every per-token quantity is taken over the last (feature) axis and averaged over the batch and
positions afterwards, so a stream `[B, T, d]` yields a vector `[B, T]` and then one number.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

TINY = 1e-12


def token_norms(x: torch.Tensor) -> torch.Tensor:
    """L2 norm of every token vector: `[..., d] -> [...]`."""
    x = x if x.dtype == torch.float64 else x.float()
    return torch.linalg.vector_norm(x, dim=-1)


def mean_token_norm(x: torch.Tensor) -> float:
    """Mean over tokens of `||x_t||` (for LayerNorm output with unit gain this is ~sqrt(d))."""
    return token_norms(x).mean().item()


def cosine_from_parts(dot: torch.Tensor, norm_a: torch.Tensor, norm_b: torch.Tensor
                      ) -> torch.Tensor:
    """Per-token cosine from a dot product and the two norms, clamped to [-1, 1]."""
    return (dot / (norm_a * norm_b).clamp_min(TINY)).clamp(-1.0, 1.0)


def token_cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per-token cosine similarity of two streams of the same shape: `[..., d] -> [...]`."""
    a, b = a.float(), b.float()
    return cosine_from_parts((a * b).sum(-1), token_norms(a), token_norms(b))


def angular_from_cosine(cos: torch.Tensor) -> torch.Tensor:
    """Angular distance `arccos(cos) / pi` in [0, 1] (Gromov et al. 2024; Curse of Depth)."""
    return torch.arccos(cos.clamp(-1.0, 1.0)) / math.pi


def angle_from_sides(len_a: torch.Tensor, len_b: torch.Tensor, len_diff: torch.Tensor
                     ) -> torch.Tensor:
    """Angle (radians) between vectors a and b from `|a|`, `|b|` and `|a - b|`.

    Kahan's stable triangle formula ("Miscalculating Area and Angles of a Needle-like Triangle",
    2014): unlike `arccos` of a cosine it is exact near 0, so identical vectors give exactly 0
    and nearly identical consecutive streams are not swamped by rounding.
    """
    a = torch.maximum(len_a, len_b)
    b = torch.minimum(len_a, len_b)
    c = len_diff
    mu = torch.where(b >= c, c - (a - b), b - (a - c))
    num = ((a - b) + c) * mu
    den = (a + (b + c)) * ((a - c) + b)
    ratio = num.clamp_min(0.0) / den.clamp_min(TINY)
    return 2.0 * torch.atan(ratio.sqrt())


def angular_from_sides(len_a: torch.Tensor, len_b: torch.Tensor, len_diff: torch.Tensor
                       ) -> torch.Tensor:
    """Angular distance `angle / pi` in [0, 1] (`arccos(cos) / pi`) from the three lengths."""
    return angle_from_sides(len_a, len_b, len_diff) / math.pi


def angular_distance(a: torch.Tensor, b: torch.Tensor) -> float:
    """Mean over tokens of `arccos(cos(a_t, b_t)) / pi` (Gromov et al. 2024, "The Unreasonable
    Ineffectiveness of the Deeper Layers", arXiv 2403.17887); exactly 0 for identical inputs."""
    a, b = a.double(), b.double()
    return angular_from_sides(token_norms(a), token_norms(b), token_norms(a - b)).mean().item()


def relative_update(x_in: torch.Tensor, x_out: torch.Tensor) -> float:
    """Mean over tokens of `||x_out - x_in|| / ||x_in||`."""
    return (token_norms(x_out - x_in) / token_norms(x_in).clamp_min(TINY)).mean().item()


def model_loss(kind: str, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The model's own loss: next-token cross-entropy (decoder, -100 ignored) or class
    cross-entropy (encoder, one label per sequence)."""
    if kind == "decoder":
        return F.cross_entropy(logits.flatten(0, -2).float(), targets.flatten(), ignore_index=-100)
    return F.cross_entropy(logits.float(), targets)


def kl_divergence(logits_p: torch.Tensor, logits_q: torch.Tensor) -> float:
    """`KL(p || q)` of the output distributions, summed over the vocabulary (or classes) and
    averaged over positions (decoder) or sequences (encoder), in nats."""
    logp = F.log_softmax(logits_p.float(), dim=-1)
    logq = F.log_softmax(logits_q.float(), dim=-1)
    return (logp.exp() * (logp - logq)).sum(-1).mean().item()
