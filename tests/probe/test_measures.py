"""The probes' arithmetic against values worked out by hand or with torch's own functions: norms,
cosines (clamped, zero vectors), Kahan's angle on both branches, relative update, loss, KL."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from normlab.probe.measures import (
    angle_from_sides,
    angular_distance,
    angular_from_cosine,
    angular_from_sides,
    cosine_from_parts,
    kl_divergence,
    mean_token_norm,
    model_loss,
    relative_update,
    token_cosine,
    token_norms,
)

T64 = torch.float64


def test_token_norms_and_their_dtype():
    x = torch.tensor([[[3.0, 4.0], [0.0, 1.0]]], dtype=T64)
    assert token_norms(x).tolist() == [[5.0, 1.0]] and token_norms(x).dtype == T64
    assert token_norms(x.bfloat16()).dtype == torch.float32  # low precision is widened
    assert token_norms(x.half()).dtype == torch.float32
    assert mean_token_norm(x) == 3.0


def test_cosines():
    dot = torch.tensor([2.0, -8.0, 0.0, 4.0000001], dtype=T64)
    na = torch.tensor([1.0, 2.0, 0.0, 2.0], dtype=T64)
    nb = torch.tensor([4.0, 4.0, 0.0, 2.0], dtype=T64)
    # a zero vector gives 0 (not NaN); rounding above 1 is clamped
    assert cosine_from_parts(dot, na, nb).tolist() == [0.5, -1.0, 0.0, 1.0]
    assert cosine_from_parts(torch.tensor([1e-13]), torch.tensor([1e-7]),
                             torch.tensor([1e-7])).item() == pytest.approx(0.1)
    assert cosine_from_parts(torch.tensor([-5.0]), torch.tensor([1.0]),
                             torch.tensor([1.0])).item() == -1.0
    a = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    b = torch.tensor([[0.0, 2.0], [2.0, 2.0]])
    assert token_cosine(a, b).tolist() == pytest.approx([0.0, 1.0])
    assert token_cosine(a.double(), b.double()).dtype == torch.float32
    # a stream [B, T, d]: one cosine per token, over the feature axis
    a3 = torch.tensor([[[1.0, 0.0, 0.0], [1.0, 1.0, 0.0]], [[0.0, 0.0, 2.0], [1.0, 0.0, 0.0]]])
    b3 = torch.tensor([[[2.0, 0.0, 0.0], [0.0, 1.0, 0.0]], [[0.0, 0.0, -1.0], [0.0, 3.0, 0.0]]])
    torch.testing.assert_close(token_cosine(a3, b3), torch.tensor([[1.0, 0.5 ** 0.5], [-1.0, 0.0]]))


def test_angular_from_cosine():
    cos = torch.tensor([1.0, 0.0, -1.0, 0.5, 1.5, -2.0], dtype=T64)
    assert angular_from_cosine(cos).tolist() == pytest.approx([0.0, 0.5, 1.0, 1 / 3, 0.0, 1.0])


@pytest.mark.parametrize("theta", [1e-3, 0.3, 1.0, math.pi / 2, 2.5, math.pi - 1e-3])
@pytest.mark.parametrize("ra, rb", [(1.0, 1.0), (1.0, 3.0), (5.0, 0.5)])
def test_angle_from_sides_against_the_angle_drawn(theta, ra, rb):
    a = torch.tensor([ra, 0.0], dtype=T64)
    b = torch.tensor([rb * math.cos(theta), rb * math.sin(theta)], dtype=T64)
    la, lb, ld = (torch.linalg.vector_norm(v) for v in (a, b, a - b))
    assert angle_from_sides(la, lb, ld).item() == pytest.approx(theta, rel=1e-8)
    assert angle_from_sides(lb, la, ld).item() == pytest.approx(theta, rel=1e-8)  # symmetric
    assert angular_from_sides(la, lb, ld).item() == pytest.approx(theta / math.pi, rel=1e-8)


def test_angle_edges():
    one = torch.tensor([1.0], dtype=T64)
    assert angle_from_sides(one, one, torch.zeros(1, dtype=T64)).item() == 0.0  # identical
    assert angle_from_sides(one, one, 2 * one).item() == pytest.approx(math.pi)  # opposite
    assert angle_from_sides(one, 2 * one, one).item() == pytest.approx(0.0, abs=1e-7)  # aligned
    # a zero vector: no angle to speak of, and no NaN
    assert math.isfinite(angle_from_sides(torch.zeros(1), torch.zeros(1), torch.zeros(1)).item())


def test_angular_distance_is_a_mean_over_tokens():
    a = torch.tensor([[[1.0, 0.0], [1.0, 0.0]]])
    b = torch.tensor([[[0.0, 1.0], [1.0, 0.0]]])  # 90 degrees, then 0
    assert angular_distance(a, b) == pytest.approx(0.25, abs=1e-12)
    x = torch.randn(2, 3, 8)
    assert angular_distance(x, x) == 0.0


def test_relative_update():
    x_in = torch.tensor([[[3.0, 4.0], [1.0, 0.0]]])
    x_out = torch.tensor([[[3.0, 4.0 + 5.0], [1.0, 2.0]]])  # 5/5 and 2/1
    assert relative_update(x_in, x_out) == pytest.approx(1.5)
    zero = relative_update(torch.zeros(1, 1, 2), torch.ones(1, 1, 2))
    assert math.isfinite(zero) and zero == pytest.approx(math.sqrt(2) / 1e-12)


def test_model_loss():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 5)
    targets = torch.tensor([[1, -100, 4], [0, 2, -100]])
    keep = targets != -100
    want = F.cross_entropy(logits[keep], targets[keep])
    assert model_loss("decoder", logits, targets).item() == pytest.approx(want.item(), rel=1e-6)
    assert model_loss("decoder", logits.bfloat16(), targets).dtype == torch.float32
    cls = torch.randn(4, 3)
    labels = torch.tensor([0, 2, 1, 2])
    assert model_loss("encoder", cls, labels).item() == pytest.approx(
        F.cross_entropy(cls, labels).item(), rel=1e-6)


def test_kl_divergence():
    p = torch.log(torch.tensor([[0.5, 0.5], [0.9, 0.1]]))
    q = torch.log(torch.tensor([[0.9, 0.1], [0.9, 0.1]]))
    kl = (0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1)) / 2  # mean over 2 positions
    assert kl_divergence(p, q) == pytest.approx(kl, rel=1e-6)
    assert kl_divergence(p + 3.0, q - 1.0) == pytest.approx(kl, rel=1e-5)  # logits, any shift
    assert kl_divergence(q, q) == 0.0
    assert kl_divergence(q, p) != pytest.approx(kl)  # not symmetric
    # a decoder's [batch, positions, vocab]: summed over the vocabulary, averaged over positions
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(2, 3, 5, generator=gen), torch.randn(2, 3, 5, generator=gen)
    each = [float((pa.softmax(-1) * (pa.log_softmax(-1) - pb.log_softmax(-1))).sum())
            for pa, pb in zip(a.reshape(6, 5), b.reshape(6, 5), strict=True)]
    assert kl_divergence(a, b) == pytest.approx(sum(each) / 6, rel=1e-5)
