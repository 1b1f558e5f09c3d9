"""Token arrays and batch sampling at their edges, on small hand-made texts: spans and separators,
the unigram entropy, the last window start, every error word for word, the split's labels."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from normlab.data.batches import (
    SEPARATOR,
    BatchSampler,
    Span,
    TokenArray,
    eval_batches,
)
from normlab.data.corpus import DataError, Work
from normlab.data.tasks import load_text_data


def raises(message: str):
    return pytest.raises(DataError, match="^" + re.escape(message) + "$")


def test_from_works_layout():
    arr = TokenArray.from_works([Work("a", b"xyz"), Work("b", b""), Work("c", b"pq")], "lbl")
    assert SEPARATOR == b"\n\n"
    assert bytes(arr.data) == b"xyz\n\n\n\npq"
    assert arr.spans == (Span("a", 0, 3), Span("b", 5, 5), Span("c", 7, 9))
    assert arr.names == ["a", "b", "c"] and len(arr) == 9 and arr.label == "lbl"
    assert repr(arr) == "TokenArray('lbl', 9 bytes, 3 works)"
    assert arr.data.dtype == np.uint8 and not arr.data.flags.writeable
    assert TokenArray.from_works([Work("a", b"q")]).label == "data"
    with raises("val split: no works to build a token array from"):
        TokenArray.from_works([], "val split")
    with raises("data: token array must be 1-D, got shape (2, 2)"):
        TokenArray(np.zeros((2, 2)), [])


def test_first_at_or_above_finds_the_first_id_past_a_vocabulary(monkeypatch):
    import normlab.data.batches as batches

    arr = TokenArray(np.array([3, 9, 1, 7, 9, 2], dtype=np.uint16), [Span("t", 0, 6)])
    assert arr.first_at_or_above(7) == (1, 9)  # the first, not the largest; >= counts
    assert arr.first_at_or_above(9) == (1, 9)
    assert arr.first_at_or_above(10) is None  # nothing that large
    assert arr.first_at_or_above(0) == (0, 3)
    monkeypatch.setattr(batches, "CHUNK", 2)  # scanned a chunk at a time
    assert arr.first_at_or_above(7) == (1, 9)
    assert arr.first_at_or_above(4) == (1, 9)
    late = TokenArray(np.array([1, 1, 1, 1, 8, 9], dtype=np.uint16), [Span("t", 0, 6)])
    assert late.first_at_or_above(8) == (4, 8)  # in the third chunk, at its start
    assert late.first_at_or_above(9) == (5, 9)  # second of its chunk
    empty = TokenArray(np.array([], dtype=np.uint16), [])
    assert empty.first_at_or_above(0) is None
    one = TokenArray(np.array([5], dtype=np.uint16), [Span("t", 0, 1)])
    assert one.first_at_or_above(5) == (0, 5)


def test_unigram_entropy():
    arr = TokenArray(np.frombuffer(b"aabbbbcc", dtype=np.uint8), [Span("t", 0, 8)])
    p = np.array([0.25, 0.5, 0.25])
    assert arr.unigram_entropy == pytest.approx(float(-(p * np.log(p)).sum()), rel=1e-12)
    one = TokenArray(np.frombuffer(b"zzzz", dtype=np.uint8), [Span("t", 0, 4)])
    assert one.unigram_entropy == 0.0


def small(n: int = 12) -> TokenArray:
    return TokenArray(np.arange(n, dtype=np.uint8), [Span("t", 0, n)], "train split of t")


def test_windows_and_the_last_start():
    s = BatchSampler(small(12), batch_size=64, seq_len=4, seed=3)
    starts = s.offsets(0)
    assert starts.dtype == np.int64 and starts.shape == (64,)
    assert starts.min() >= 0 and starts.max() == 7  # the last start leaves 5 bytes: x and y
    x, y = s.batch(0)
    assert x.dtype == torch.int64 and x.shape == (64, 4) and y.shape == (64, 4)
    torch.testing.assert_close(x, torch.as_tensor(starts)[:, None] + torch.arange(4))
    torch.testing.assert_close(y, x + 1)
    assert x.is_contiguous() and y.is_contiguous()
    assert s(0)[0].equal(x)  # calling the sampler is batch()
    # exactly seq_len + 1 bytes: one window, starting at 0
    tight = BatchSampler(small(5), batch_size=3, seq_len=4, seed=0)
    assert tight.offsets(9).tolist() == [0, 0, 0]


def test_offsets_come_from_seed_and_step():
    s = BatchSampler(small(200), batch_size=8, seq_len=4, seed=5)
    want = np.random.default_rng([5, 11]).integers(0, 196, size=8, dtype=np.int64)
    assert s.offsets(11).tolist() == want.tolist()
    assert s.offsets(np.int64(11)).tolist() == want.tolist()


@pytest.mark.parametrize("kw, message", [
    ({"batch_size": 0}, "batch_size must be a positive integer, got 0"),
    ({"batch_size": True}, "batch_size must be a positive integer, got True"),
    ({"batch_size": 2.0}, "batch_size must be a positive integer, got 2.0"),
    ({"seq_len": 0}, "seq_len must be a positive integer, got 0"),
    ({"seed": -1}, "seed must be a non-negative integer, got -1"),
    ({"seed": True}, "seed must be a non-negative integer, got True"),
    ({"seed": 1.0}, "seed must be a non-negative integer, got 1.0"),
    ({"seq_len": 12}, "the train split of t has 12 bytes but seq_len=12 needs at least 13; "
                      "lower seq_len, give more text, or change val_fraction"),
])
def test_sampler_errors(kw, message):
    args = {"batch_size": 2, "seq_len": 4, "seed": 0} | kw
    with raises(message):
        BatchSampler(small(12), **args)


def test_sampler_accepts_numpy_integers_and_seed_zero():
    s = BatchSampler(small(12), batch_size=np.int64(2), seq_len=np.int32(4), seed=np.int64(0))
    assert (s.batch_size, s.seq_len, s.seed) == (2, 4, 0)
    assert type(s.batch_size) is int and type(s.seed) is int
    assert BatchSampler(small(12), 1, 11, 0).offsets(0).tolist() == [0]


@pytest.mark.parametrize("step", [-1, True, 1.5, "3"])
def test_bad_step(step):
    s = BatchSampler(small(12), 2, 4, 0)
    with raises(f"step must be a non-negative integer, got {step!r}"):
        s.offsets(step)


def test_eval_batches():
    arr = small(50)
    batches = eval_batches(arr, 4, 5, 3, seed=2)
    sampler = BatchSampler(arr, 4, 5, 2)
    assert len(batches) == 3
    for i, (x, y) in enumerate(batches):
        assert x.equal(sampler.batch(i)[0]) and y.equal(sampler.batch(i)[1])
    with raises("n_batches must be a positive integer, got 0"):
        eval_batches(arr, 4, 5, 0, seed=2)


def test_load_text_data_labels(tmp_path: Path):
    folder = tmp_path / "texts"
    folder.mkdir()
    for name, size in (("a", 300), ("b", 40), ("c", 300), ("d", 300)):
        (folder / f"{name}.txt").write_bytes(b"w" * size)
    data = load_text_data(folder, val_fraction=0.05, seed=0)
    assert data.train.label == f"train split of {folder}"
    assert data.val.label == f"val split of {folder}"
    assert sorted(data.train_works + data.val_works) == ["a", "b", "c", "d"]
    assert data.train.names == data.train_works and data.val.names == data.val_works
    assert len(data.val) + len(data.train) == 940 + 2 * (len(data.train_works) - 1) + 2 * (
        len(data.val_works) - 1)
    files = [str(folder / f"{n}.txt") for n in "abcd"]
    listed = load_text_data(files, val_fraction=0.05, seed=0)
    assert listed.train.label == f"train split of {files[0]}, {files[1]}, {files[2]}, ..."
    three = load_text_data(files[:3], val_fraction=0.2, seed=0)
    assert three.val.label == f"val split of {', '.join(files[:3])}"
    assert load_text_data(files, seed=0).val_works == load_text_data(files).val_works
    assert math.isfinite(data.train.unigram_entropy)


def test_load_text_data_passes_fraction_and_seed(tmp_path: Path):
    for name, size in (("a", 300), ("b", 300), ("c", 60), ("d", 300)):
        (tmp_path / f"{name}.txt").write_bytes(b"w" * size)
    # seed 0 takes c (60 of 960 bytes) first: enough for 5%, not for the default 10%
    assert load_text_data(tmp_path, val_fraction=0.05, seed=0).val_works == ["c"]
    assert load_text_data(tmp_path, seed=0).val_works == ["a", "c"]
    assert load_text_data(tmp_path, val_fraction=0.05, seed=1).val_works == ["a"]
