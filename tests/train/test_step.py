"""One optimizer step's arithmetic (`normlab.train.step`), called directly on a tiny float64
model: accumulation against one larger batch, which batches a step reads, where DDP syncs, what
the block statistics capture, the gradient norm, clipping and the update. Milliseconds each, so
the mutation row of `step.py` runs them for every mutant (docs/testing.md)."""

from __future__ import annotations

import contextlib
import math

import pytest
import torch

from normlab.config import ModelConfig
from normlab.nn import build_model
from normlab.train import distributed
from normlab.train.step import (
    Accumulated,
    accumulate_gradients,
    clip_and_step,
    gradient_norm,
    set_lr,
)

CPU = torch.device("cpu")


@pytest.fixture
def float64():
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(torch.float32)


def tiny_model(seed: int = 0) -> torch.nn.Module:
    cfg = ModelConfig(n_blocks=2, d_model=16, n_heads=2, max_seq_len=8, vocab_size=32)
    return build_model(cfg, seed=seed)


class Sampler:
    """Batch `i` is a fixed function of `i` (rows of random tokens); records what was read."""

    def __init__(self, batch_size: int = 4, seq_len: int = 8, vocab: int = 32) -> None:
        self.batch_size, self.seq_len, self.vocab = batch_size, seq_len, vocab
        self.read: list[int] = []

    def rows(self, i: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(1000 + i)
        t = torch.randint(0, self.vocab, (n, self.seq_len + 1), generator=g)
        return t[:, :-1], t[:, 1:]

    def batch(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.read.append(i)
        return self.rows(i, self.batch_size)


class Joined(Sampler):
    """Batch `k` holds the rows of `Sampler`'s batches `2k` and `2k + 1`: one batch of twice the
    size with the same sequences as two micro-batches."""

    def batch(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.read.append(i)
        parts = [self.rows(j, self.batch_size // 2) for j in (2 * i, 2 * i + 1)]
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_two_micro_batches_give_the_gradient_and_loss_of_one_batch(float64):
    """Two micro-batches of 2 against one batch of the same 4 sequences: the same mean loss and
    the same gradients (float64 model, float32 cross-entropy: agreement to ~1e-7; a loss not
    divided by the micro-batch count is off by 2x, a wrong micro-batch by percents)."""
    a, b = tiny_model(), tiny_model()
    acc = accumulate_gradients(a, Sampler(batch_size=2), 3, 2, distributed.SINGLE, CPU,
                               contextlib.nullcontext())
    one = accumulate_gradients(b, Joined(batch_size=4), 3, 1, distributed.SINGLE, CPU,
                               contextlib.nullcontext())
    assert isinstance(acc, Accumulated)
    assert acc.train_loss == pytest.approx(one.train_loss, rel=1e-6, abs=0)
    assert 2.0 < acc.train_loss < 5.0  # near ln 32 at init: a real loss, not a zero
    ga, gb = grads(a), grads(b)
    assert ga.keys() == gb.keys() and len(ga) > 10
    for k in ga:
        torch.testing.assert_close(ga[k], gb[k], rtol=1e-6, atol=1e-9, msg=k)


def test_train_loss_is_the_mean_of_the_micro_batch_losses(float64):
    model, sampler = tiny_model(), Sampler(batch_size=2)
    acc = accumulate_gradients(model, sampler, 0, 3, distributed.SINGLE, CPU,
                               contextlib.nullcontext())
    with torch.no_grad():
        each = [tiny_model()(*Sampler(batch_size=2).batch(i)).loss.item() for i in range(3)]
    assert acc.train_loss == pytest.approx(sum(each) / 3, rel=1e-9)
    assert len(set(each)) == 3  # three different batches, so a repeated one would show


@pytest.mark.parametrize(("step", "accum", "expected"), [(0, 1, [0]), (3, 2, [6, 7]),
                                                         (2, 3, [6, 7, 8])])
def test_step_reads_batches_step_times_accum_plus_micro(step, accum, expected):
    sampler = Sampler()
    accumulate_gradients(tiny_model(), sampler, step, accum, distributed.SINGLE, CPU,
                         contextlib.nullcontext())
    assert sampler.read == expected


class RecordingDist(distributed.Dist):
    """One process that records the calls DDP would answer: shards, syncs and the mean."""

    def __init__(self) -> None:
        super().__init__()
        self.synced: list[bool] = []
        self.sharded = 0
        self.means: list[float] = []

    def shard(self, x, y):
        self.sharded += 1
        return x[:1], y[:1]  # this rank's rows: the first

    def sync_context(self, net, sync):
        self.synced.append(sync)
        return contextlib.nullcontext()

    def mean(self, value):
        self.means.append(value.item())
        return value / 2  # as if the other rank's loss were 0


def test_ddp_syncs_on_the_last_micro_batch_and_the_loss_is_averaged_over_ranks():
    dist = RecordingDist()
    model = tiny_model()
    acc = accumulate_gradients(model, Sampler(), 0, 3, dist, CPU, contextlib.nullcontext())
    assert dist.synced == [False, False, True]
    assert dist.sharded == 3
    assert len(dist.means) == 1
    # the rank's own rows (the first of each batch) were the ones trained on
    with torch.no_grad():
        own = [tiny_model()(*(t[:1] for t in Sampler().batch(i))).loss.item() for i in range(3)]
    assert dist.means[0] == pytest.approx(sum(own), rel=1e-6)
    assert acc.train_loss == pytest.approx(sum(own) / 2 / 3, rel=1e-6)


class Counting:
    """A context manager that counts the forwards run inside it; yields a sentinel."""

    def __init__(self, model: torch.nn.Module, sentinel: object = None) -> None:
        self.inside, self.entered, self.forwards = False, 0, 0
        self.sentinel = sentinel
        model.register_forward_hook(self._hook)

    def _hook(self, *_):
        self.forwards += self.inside

    def __enter__(self):
        self.inside, self.entered = True, self.entered + 1
        return self.sentinel

    def __exit__(self, *exc):
        self.inside = False


def test_the_capture_wraps_micro_batch_0_only_and_autocast_every_micro_batch():
    model = tiny_model()
    sentinel = object()
    cap = Counting(model, sentinel)
    autocast = Counting(model)
    acc = accumulate_gradients(model, Sampler(), 1, 3, distributed.SINGLE, CPU, autocast, cap)
    assert (cap.entered, cap.forwards) == (1, 1)
    assert (autocast.entered, autocast.forwards) == (3, 3)
    assert acc.captured is sentinel
    # without a capture, micro-batch 0 runs plainly and nothing is captured
    plain = accumulate_gradients(model, Sampler(), 1, 2, distributed.SINGLE, CPU,
                                 contextlib.nullcontext())
    assert plain.captured is None


def test_the_step_gradient_is_the_mean_of_the_micro_batch_gradients():
    """From freed gradients (`clip_and_step` sets them to None), two micro-batches add up to
    half of each one's own gradient."""
    model = tiny_model()
    accumulate_gradients(model, Sampler(), 0, 2, distributed.SINGLE, CPU,
                         contextlib.nullcontext())
    both = grads(model)
    parts = []
    for i in (0, 1):
        m = tiny_model()
        m(*Sampler().batch(i)).loss.backward()
        parts.append(grads(m))
    for k in both:
        torch.testing.assert_close(both[k], (parts[0][k] + parts[1][k]) / 2, rtol=1e-5,
                                   atol=1e-7, msg=k)


def test_gradient_norm_covers_exactly_the_parameters_with_a_gradient():
    model = tiny_model()
    model(*Sampler().batch(0)).loss.backward()
    frozen = next(p for n, p in model.named_parameters() if n.endswith("weight") and p.ndim == 2)
    frozen.grad = None
    params, norm = gradient_norm(model.parameters())
    with_grad = [p for p in model.parameters() if p.grad is not None]
    assert len(params) == len(with_grad) == len(list(model.parameters())) - 1
    assert all(any(p is q for q in with_grad) for p in params)
    by_hand = math.sqrt(sum(float((p.grad.double() ** 2).sum()) for p in with_grad))
    assert norm.item() == pytest.approx(by_hand, rel=1e-6)


def sgd_step(grad_clip: float | None, scale: float) -> tuple[float, float, bool]:
    """One `clip_and_step` with SGD at lr 1 on gradients scaled by `scale`: the norm before,
    the norm of the update taken, and whether the gradients were freed."""
    model = tiny_model()
    model(*Sampler().batch(0)).loss.backward()
    for p in model.parameters():
        p.grad *= scale
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    params, norm = gradient_norm(model.parameters())
    clip_and_step(opt, params, norm, grad_clip)
    update = math.sqrt(sum(float(((before[n] - p.detach()) ** 2).sum())
                           for n, p in model.named_parameters()))
    freed = all(p.grad is None for p in model.parameters())
    return norm.item(), update, freed


def test_clipping_scales_a_large_gradient_to_the_clip_norm():
    norm, update, freed = sgd_step(0.5, scale=10.0)
    assert norm > 1.0
    assert update == pytest.approx(0.5, rel=1e-4)
    assert freed


def test_a_gradient_below_the_clip_norm_is_left_alone():
    norm, update, freed = sgd_step(1e6, scale=1.0)
    assert update == pytest.approx(norm, rel=1e-5)
    assert freed


def test_no_clip_takes_the_whole_gradient():
    norm, update, freed = sgd_step(None, scale=10.0)
    assert norm > 1.0 and update == pytest.approx(norm, rel=1e-5)
    assert freed


def test_set_lr_sets_every_group():
    model = tiny_model()
    params = list(model.parameters())
    opt = torch.optim.AdamW([{"params": params[:2]}, {"params": params[2:]}], lr=1.0)
    set_lr(opt, 3e-4)
    assert [g["lr"] for g in opt.param_groups] == [3e-4, 3e-4]


class DeviceDist(distributed.Dist):
    """Records the module each micro-batch syncs and the device of the loss it averages."""

    def __init__(self) -> None:
        super().__init__()
        self.nets: list[torch.nn.Module] = []
        self.mean_device: torch.device | None = None

    def sync_context(self, net, sync):
        self.nets.append(net)
        return contextlib.nullcontext()

    def mean(self, value):
        self.mean_device = value.device
        return torch.zeros(())  # a meta tensor has no value to read


class DeviceNet(torch.nn.Module):
    """A stand-in network on the `meta` device that records where its inputs are."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(1, device="meta"))
        self.seen: list[tuple[str, str]] = []

    def forward(self, x, y):
        from types import SimpleNamespace

        self.seen.append((x.device.type, y.device.type))
        return SimpleNamespace(loss=(self.w * x.float().mean()).sum())


def test_batches_and_the_loss_live_on_the_step_device_and_ddp_syncs_the_wrapped_net():
    """On a device other than the CPU (here `meta`, which every build of torch has): inputs,
    targets and the summed loss are moved there, and DDP's sync context gets the network."""
    net, dist = DeviceNet(), DeviceDist()
    accumulate_gradients(net, Sampler(), 0, 2, dist, torch.device("meta"),
                         contextlib.nullcontext())
    assert net.seen == [("meta", "meta")] * 2
    assert dist.mean_device == torch.device("meta")
    assert dist.nets == [net, net]


class Masked(Sampler):
    """`Sampler`'s batches with targets ignored (-100, as a synthetic task's positions without
    an answer): batch i keeps the last i + 1 targets of each row, so micro-batches count
    different numbers of targets."""

    def rows(self, i: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = super().rows(i, n)
        y = y.clone()
        y[:, : max(0, self.seq_len - (i % 4) - 1)] = -100
        return x, y


class MaskedJoined(Masked, Joined):
    pass


def test_token_weighting_gives_the_mean_over_every_counted_target(float64):
    """Micro-batches counting 2 and 4 targets: weighted by their counts they give the loss and
    gradient of one batch's mean over its 6 targets; the plain mean of the two means does not."""
    joined = tiny_model()
    one = accumulate_gradients(joined, MaskedJoined(batch_size=4), 0, 1, distributed.SINGLE, CPU,
                               contextlib.nullcontext(), token_weighted=True)
    weighted = tiny_model()
    acc = accumulate_gradients(weighted, Masked(batch_size=2), 0, 2, distributed.SINGLE, CPU,
                               contextlib.nullcontext(), token_weighted=True)
    assert acc.train_loss == pytest.approx(one.train_loss, rel=1e-6, abs=0)
    for k, g in grads(joined).items():
        torch.testing.assert_close(grads(weighted)[k], g, rtol=1e-6, atol=1e-9, msg=k)
    # and both are the plain loss of that batch (cross-entropy over its counted targets) and its
    # gradient, not a multiple of them: both sides scaled alike would pass the checks above
    direct = tiny_model()
    loss = direct(*MaskedJoined(batch_size=4).batch(0)).loss
    loss.backward()
    assert acc.train_loss == pytest.approx(loss.item(), rel=1e-6, abs=0)
    for k, g in grads(direct).items():
        torch.testing.assert_close(grads(weighted)[k], g, rtol=1e-6, atol=1e-9, msg=k)
    plain = accumulate_gradients(tiny_model(), Masked(batch_size=2), 0, 2, distributed.SINGLE,
                                 CPU, contextlib.nullcontext())
    assert plain.train_loss != pytest.approx(one.train_loss, rel=1e-3)
