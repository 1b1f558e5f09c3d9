"""A run's token data kept on its device: `BatchSampler.to(device)` gathers each step's windows
from the array's copy there and gives the batches the host sampler gives (a function of the seed
and the step alone), for every token width; an array too large for the device stays on the
host. (CPU stands in for the device here; tests/gpu/test_gpu_device_batches.py runs it on CUDA.)"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import normlab.data.batches as batches
from normlab.data.batches import BatchSampler, Span, TokenArray


def array(dtype, n: int = 5000) -> TokenArray:
    high = {np.uint8: 256, np.uint16: 50_000, np.uint32: 4_000_000_000}[dtype]
    data = np.random.default_rng(0).integers(0, high, size=n, dtype=np.int64).astype(dtype)
    data.flags.writeable = False
    return TokenArray(data, [Span("all", 0, n)])


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32])
def test_device_batches_are_the_host_batches(dtype):
    tokens = array(dtype)
    host = BatchSampler(tokens, batch_size=6, seq_len=32, seed=3)
    device = host.to("cpu")
    assert device is not host and device.device == torch.device("cpu") and host.device is None
    for step in (0, 1, 7, 1000, 7):  # in any order, the same batch for a step
        hx, hy = host.batch(step)
        dx, dy = device.batch(step)
        assert dx.dtype == dy.dtype == torch.int64 and dx.is_contiguous() and dy.is_contiguous()
        assert torch.equal(dx, hx) and torch.equal(dy, hy)
    assert int(device.batch(5)[0].max()) > 255 or dtype == np.uint8  # wide ids kept whole


def test_the_device_copy_is_made_once_for_every_sampler():
    tokens = array(np.uint16)
    a = BatchSampler(tokens, 4, 16, seed=0).to("cpu")
    b = BatchSampler(tokens, 4, 16, seed=1).to("cpu")
    a.batch(0), b.batch(0)
    assert tokens.on_device(torch.device("cpu")) is tokens.on_device(torch.device("cpu"))
    assert len(tokens._on_device) == 1
    assert tokens.device_bytes() == 4 * len(tokens)  # uint16 ids held as int32


def test_an_array_too_large_for_the_device_stays_on_the_host(monkeypatch):
    tokens = array(np.uint8)
    monkeypatch.setattr(batches, "DEVICE_TOKENS_MAX_BYTES", len(tokens) - 1)
    host = BatchSampler(tokens, 4, 16, seed=0)
    assert host.to("cpu") is host
    assert tokens._on_device == {}


@pytest.mark.parametrize("where", ["host", "device"])
@pytest.mark.parametrize("dtype", [np.uint8, np.uint32])
def test_a_groups_batch_is_each_members_batch_gathered_at_once(dtype, where, monkeypatch):
    """`stacked_batch`: members of one array gathering in one place (the host, or the device),
    each with its own seed and step, are gathered in one indexing, giving each one's own batch;
    the one-by-one path is not taken."""
    tokens = array(dtype)
    samplers = [BatchSampler(tokens, 6, 32, seed=s) for s in (0, 1, 5)]
    if where == "device":
        samplers = [s.to("cpu") for s in samplers]
    steps = [4, 4, 900]
    want = [s.batch(step) for s, step in zip(samplers, steps, strict=True)]
    monkeypatch.setattr(BatchSampler, "batch", lambda *_: pytest.fail("gathered one by one"))
    x, y = batches.stacked_batch(samplers, steps)
    assert x.shape == y.shape == (3, 6, 32) and x.is_contiguous() and y.is_contiguous()
    assert torch.equal(x, torch.stack([w[0] for w in want]))
    assert torch.equal(y, torch.stack([w[1] for w in want]))


def test_other_samplers_are_stacked_one_by_one():
    """Samplers of different arrays, or one on the host and one on the device, give their own
    batches, stacked."""
    a, b = array(np.uint8), array(np.uint16)
    for samplers in ([BatchSampler(a, 4, 16, seed=0), BatchSampler(a, 4, 16, seed=1).to("cpu")],
                     [BatchSampler(a, 4, 16, seed=0).to("cpu"),
                      BatchSampler(b, 4, 16, seed=0).to("cpu")]):
        x, y = batches.stacked_batch(samplers, [3, 8])
        assert torch.equal(x[1], samplers[1].batch(8)[0]) and torch.equal(y[0],
                                                                           samplers[0].batch(3)[1])


def test_a_group_of_one_and_a_mismatched_group():
    """One member gathers its own batch; steps that do not match the samplers one for one are
    refused on either path, never paired up short."""
    tokens = array(np.uint8)
    alone = [BatchSampler(tokens, 4, 16, seed=2).to("cpu")]
    x, y = batches.stacked_batch(alone, [6])
    assert torch.equal(x[0], alone[0].batch(6)[0]) and torch.equal(y[0], alone[0].batch(6)[1])
    for samplers in ([BatchSampler(tokens, 4, 16, seed=s).to("cpu") for s in (0, 1)],
                     [BatchSampler(tokens, 4, 16, seed=s) for s in (0, 1)]):
        with pytest.raises(ValueError):
            batches.stacked_batch(samplers, [3])
        with pytest.raises(ValueError):
            batches.stacked_batch(samplers, [3, 4, 5])


def test_an_array_exactly_at_the_device_limit_goes_to_the_device(monkeypatch):
    tokens = array(np.uint16)
    monkeypatch.setattr(batches, "DEVICE_TOKENS_MAX_BYTES", tokens.device_bytes())
    assert BatchSampler(tokens, 4, 16, seed=0).to("cpu").device == torch.device("cpu")


@pytest.mark.parametrize(("dtype", "held"), [(np.uint8, torch.uint8), (np.uint16, torch.int32),
                                             (np.uint32, torch.int64)])
def test_the_device_copy_holds_ids_in_the_narrowest_type_torch_indexes(dtype, held):
    assert array(dtype).on_device(torch.device("cpu")).dtype == held


def test_a_mismatched_group_of_samplers_gathered_one_by_one_is_refused():
    a, b = array(np.uint8), array(np.uint16)
    samplers = [BatchSampler(a, 4, 16, seed=0), BatchSampler(b, 4, 16, seed=0)]
    for steps in ([3], [3, 4, 5]):
        with pytest.raises(ValueError):
            batches.stacked_batch(samplers, steps)
