"""The train/validation split at its edges: held-out bytes exactly at the target, one byte short
of it, a shortfall, a single work, and every error and warning word for word.

The permutation is numpy's `default_rng(seed).permutation(n_works)` over the works sorted by
name (the documented contract): for 4 works seed 0 gives [2, 0, 1, 3], seed 1 [0, 1, 2, 3]."""

from __future__ import annotations

import os
import re
import warnings

import pytest

from normlab.data.corpus import DataError, Work
from normlab.data.split import split_works


def works(*sizes: int) -> list[Work]:
    return [Work(name, b"x" * n) for name, n in zip("abcd", sizes, strict=False)]


def names(ws: list[Work]) -> list[str]:
    return [w.name for w in ws]


def assert_attributed_to_caller(record) -> None:
    """The warning names the caller's line (stacklevel 2), not split.py. Not checkable under
    mutation testing: mutmut's trampoline adds a frame between the two (docs/testing.md)."""
    if "MUTANT_UNDER_TEST" not in os.environ:
        assert record.filename == __file__


def test_target_reached_exactly_stops_without_a_warning():
    # 10% of 100 bytes; seed 0 takes c first, whose 10 bytes are the target exactly
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        train, val = split_works(works(10, 30, 10, 50), 0.1, seed=0)
    assert names(val) == ["c"] and names(train) == ["a", "b", "d"]


def test_one_byte_short_takes_the_next_work():
    train, val = split_works(works(10, 30, 9, 51), 0.1, seed=0)  # c: 9 of the 10 bytes
    assert names(val) == ["a", "c"] and names(train) == ["b", "d"]


def test_defaults_are_a_tenth_and_seed_0():
    ws = works(10, 30, 10, 50)
    assert split_works(ws) == split_works(ws, 0.1, seed=0)
    assert names(split_works(ws, 0.1, seed=1)[1]) == ["a"]  # another seed, another work


def test_shortfall_warns_with_the_share_held_out():
    with pytest.warns(UserWarning) as rec:
        train, val = split_works(works(10, 90), 0.5, seed=0)  # a, then b must stay
    assert names(val) == ["a"] and names(train) == ["b"]
    assert [str(w.message) for w in rec] == [
        "holding out 10.0% of the bytes instead of 50%: the one remaining work must stay in "
        "training"]
    assert_attributed_to_caller(rec[0])


def test_single_work_is_cut_by_position():
    with pytest.warns(UserWarning) as rec:
        train, val = split_works([Work("mine", b"abcde")], 0.1, seed=0)
    # 10% of 5 bytes rounds up to 1 byte: the cut is at byte 4
    assert train == [Work("mine[:4]", b"abcd")] and val == [Work("mine[4:]", b"e")]
    assert [str(w.message) for w in rec] == [
        "only one work ('mine') in the data source, so no whole work can be held out: "
        "validation is the last 10% of its bytes (from byte 4); give several files or a "
        "folder to hold out whole works"]
    assert_attributed_to_caller(rec[0])
    with pytest.warns(UserWarning):
        train, val = split_works([Work("t", b"abcdefghijklmnopqrst")], 0.25, seed=0)
    assert train == [Work("t[:15]", b"abcdefghijklmno")] and val == [Work("t[15:]", b"pqrst")]


@pytest.mark.parametrize("ws, message", [
    ([], "no works to split; the data source produced no text"),
    ([Work("a", b"xx"), Work("a", b"yy")],
     "work names must be unique to split by work; rename the duplicate files"),
    ([Work("one", b"x")], "text 'one' has only 1 byte(s); it is too short to split into train "
                          "and validation, give more text"),
])
def test_errors(ws, message):
    with pytest.raises(DataError, match="^" + re.escape(message) + "$"):
        split_works(ws, 0.1, seed=0)


def test_two_bytes_split_one_and_one():
    with pytest.warns(UserWarning):
        train, val = split_works([Work("two", b"ab")], 0.5, seed=0)
    assert train == [Work("two[:1]", b"a")] and val == [Work("two[1:]", b"b")]


@pytest.mark.parametrize("bad, message", [
    (True, "val_fraction must be a number in (0, 0.5], got True"),
    ("0.1", "val_fraction must be a number in (0, 0.5], got '0.1'"),
    (0.0, "val_fraction must be in (0, 0.5], got 0.0; e.g. use 0.1 to hold out about a tenth "
          "of the text for validation"),
    (0.7, "val_fraction must be in (0, 0.5], got 0.7; e.g. use 0.1 to hold out about a tenth "
          "of the text for validation"),
])
def test_bad_fraction(bad, message):
    with pytest.raises(DataError, match="^" + re.escape(message) + "$"):
        split_works(works(10, 30), bad, seed=0)


def test_half_is_allowed():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert split_works(works(30, 30), 0.5, seed=0) == (works(0, 30)[1:], works(30)[:1])
