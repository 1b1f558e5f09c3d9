"""The k-hop induction heads task (`data.task: khop`): a synthetic data source whose difficulty is
set by one number, the hop count k, and whose depth requirement is known from theory.

Source: Sanford, Hsu and Telgarsky 2024 (arXiv 2402.09268), "Transformers, parallel computation,
and logarithmic depth" (ICML 2024). Its abstract says:

    "We show that a constant number of self-attention layers can efficiently simulate—and be
    simulated by—a constant number of communication rounds of Massively Parallel Computation
    [...]. As a consequence, we show that logarithmic depth is sufficient for transformers to
    solve basic computational tasks that cannot be efficiently solved by several other neural
    sequence models and sub-quadratic transformer approximations."

and of this task: "The theoretical results of Section 4 prove that depth L = Θ(log k) is
necessary and sufficient for efficient transformer representation. An accompanying empirical
investigation reveals that transformers trained on the task obey the same threshold" (their
introduction). The formal definition (their Section 4) could not be retrieved, so it is not
quoted. The definition below is the task as it is
commonly stated, and it is what the authors' released generator computes (github.com/chsanford/
hop-induction-heads, `src/tasks.py`, read to check it):

    For a sequence X = X_0 .. X_{n-1} over an alphabet, the induction-head step is
        find(X, i) = 1 + max{ j < i : X_j = X_i }   (null when X_i has not occurred before),
    the position just after the last earlier occurrence of X_i. Then
        hop_1(X)_i = X_{find(X, i)}                 (what an induction head predicts at i)
        hop_k(X)_i = X_{find^k(X, i)}               (find applied k times; hop_0(X)_i = X_i)
    and hop_k(X)_i is null when any of the k steps is.

The sequences are drawn as the authors' generator draws them: the first letter uniformly, every
later one uniformly among the letters other than the one before it (so find(X, i) < i, and every
hop moves strictly left). Each sequence has its own k, drawn uniformly from
`data.khop_min_hops..data.khop_max_hops`, and starts with a token naming it.

Layout. Tokens 0..A-1 are the letters (A = `data.khop_alphabet`); token A + (k - min_hops) names
the hop count k. A sequence of `data.seq_len` = T tokens is the hop token and T - 1 letters:

    x = [hop(k), X_0, X_1, ..., X_{T-2}]
    y = [  -100, hop_k(X)_0, hop_k(X)_1, ..., hop_k(X)_{T-2}]

so the target at a position is the answer for the letter read there (not the next letter); it
depends only on the letters up to that position, so a causal decoder can compute it. Positions
without an answer (null) and the hop token's position have target -100, the `ignore_index` of the
model's cross-entropy: the loss and the accuracy count answered positions only, and a step's loss is
their mean over its whole batch however it is split into micro-batches and process shards
(`normlab.train.step.accumulate_gradients`, `token_weighted`). (The authors' generator instead asks
for a "does not exist" token there; normlab leaves those positions out by default, so that the
accuracy measures the hops and nothing else.) A sequence with no answered position at all is drawn
again, so no batch is without a target.

The authors' targets (`data.khop_unanswered: token`, C14's calibration rung). Their generator
(`src/tasks.py`, `InductionHopsFullSequenceTask`) trains on every position: a position without an
answer has the target "does not exist" and the hop token's position the target "blank", two
tokens of their own after the hop tokens (NONE_TOKEN = A + H, BLANK_TOKEN = A + H + 1 for H hop
counts; the vocabulary is A + H + 2, their `num_tokens`), and the loss is the mean over all
positions. The sequences are theirs too: no sequence is drawn again for want of an answer (every
position has a target). Their released errors count the letter targets only (`local/errors.json`,
`output < blank_token_min`), and so does `HopAccuracy` in both modes. Their layout differs from
this one by a relabelling of tokens only (their hop tokens come first, then the letters, then
"does not exist" and "blank"): their `seq_len` of 100 is a sequence of 99 tokens here
(`data.seq_len: 99`), the hop token and the first 98 letters, since they drop the last two.

Streams. Training and validation batches are functions of (seed, step) alone, from separate
random streams, and the two never share a sequence: a hash of its letters puts every possible
sequence on one side (training or held out), and a sequence drawn on the wrong side is drawn
again. Validation batches give every hop count the same number of sequences.

Metric: at each evaluation, the accuracy (argmax equals the answer) over the answered positions of
the validation batches, overall (`val_acc`) and per hop count (`val_acc_hop{k}`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from normlab.data.corpus import DataError

__all__ = [
    "IGNORE",
    "NULL",
    "HopAccuracy",
    "KhopData",
    "KhopSampler",
    "KhopTask",
    "find_positions",
    "hop",
    "hop_positions",
]

NULL = -1
"""The answer (and position) of `hop` and `find_positions` where there is none."""
IGNORE = -100
"""The target of a position without an answer: the cross-entropy's `ignore_index`."""

_STREAM = {"train": 0, "val": 1}
_TASK_KEY = 0x6B686F70  # "khop": keeps the task's random streams apart from any other use
_PRIME = 2**31 - 1      # the modulus of the split hash
_MAX_DRAWS = 1000       # draws of one row before the sampler gives up (see `KhopTask.draw`)
UNANSWERED = ("ignore", "token")  # `data.khop_unanswered`: what a position without an answer asks

Batch = tuple[torch.Tensor, torch.Tensor]


# -- the task's definition ---------------------------------------------------------------------
def _rows(x: Any) -> tuple[np.ndarray, bool]:
    arr = np.asarray(x, dtype=np.int64)
    if arr.ndim not in (1, 2):
        raise ValueError(f"expected a sequence or a batch of sequences, got shape {arr.shape}")
    if arr.size and arr.min() < 0:
        raise ValueError("letters are non-negative integers")
    return (arr[None] if arr.ndim == 1 else arr), arr.ndim == 1


def find_positions(x: Any) -> np.ndarray:
    """find(X, i) = 1 + max{j < i : X_j = X_i} at every position i, or `NULL` where X_i has not
    occurred before; `x` is one sequence [n] or a batch [B, n] of letters (int64 out, same
    shape)."""
    rows, single = _rows(x)
    batch, n = rows.shape
    out = np.full(rows.shape, NULL, dtype=np.int64)
    last = np.full((batch, int(rows.max()) + 1 if rows.size else 1), NULL, dtype=np.int64)
    index = np.arange(batch)
    for i in range(n):
        seen = last[index, rows[:, i]]
        out[:, i] = np.where(seen >= 0, seen + 1, NULL)
        last[index, rows[:, i]] = i
    return out[0] if single else out


def hop_positions(x: Any, k: int | Any) -> np.ndarray:
    """find^k(X, i) at every position (`NULL` where a step has no earlier occurrence to go to);
    `k` is one hop count, or one per sequence of a batch."""
    rows, single = _rows(x)
    ks = np.broadcast_to(np.asarray(k, dtype=np.int64), rows.shape[:1])
    if ks.size and ks.min() < 0:
        raise ValueError("the hop count k is at least 0")
    step_to = find_positions(rows)
    pos = np.broadcast_to(np.arange(rows.shape[1]), rows.shape).copy()
    for hop_index in range(int(ks.max()) if ks.size else 0):
        moving = (hop_index < ks)[:, None] & (pos >= 0)
        landed = np.take_along_axis(step_to, np.maximum(pos, 0), axis=1)
        pos = np.where(moving, landed, pos)
    return pos[0] if single else pos


def hop(x: Any, k: int | Any) -> np.ndarray:
    """hop_k(X)_i = X_{find^k(X, i)} at every position, `NULL` where undefined (see the module
    docstring); `k` is one hop count, or one per sequence of a batch."""
    rows, single = _rows(x)
    pos = hop_positions(rows, k)
    out = np.where(pos >= 0, np.take_along_axis(rows, np.maximum(pos, 0), axis=1), NULL)
    return out[0] if single else out


# -- sampling ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class KhopTask:
    """The task's settings (`data.khop_*`) and its vocabulary: letters 0..alphabet-1, then one
    token per hop count."""

    alphabet: int = 4
    min_hops: int = 1
    max_hops: int = 4
    # positions without an answer: "ignore" (target -100) or "token" (the authors' "does not
    # exist" and "blank" targets: module docstring)
    unanswered: str = "ignore"

    def __post_init__(self) -> None:
        if self.unanswered not in UNANSWERED:
            raise ValueError(f"unanswered: {self.unanswered!r} is not one of "
                             f"{', '.join(UNANSWERED)}")

    @classmethod
    def from_config(cls, data: Any) -> KhopTask:
        return cls(data.khop_alphabet, data.khop_min_hops, data.khop_max_hops,
                   getattr(data, "khop_unanswered", "ignore"))

    @property
    def hops(self) -> tuple[int, ...]:
        return tuple(range(self.min_hops, self.max_hops + 1))

    @property
    def tokens_targets(self) -> bool:
        """Positions without an answer have a target token (the authors' targets)."""
        return self.unanswered == "token"

    @property
    def none_token(self) -> int:
        """The target "does not exist" (`unanswered: token`)."""
        return self.alphabet + len(self.hops)

    @property
    def blank_token(self) -> int:
        """The target of the hop token's position (`unanswered: token`)."""
        return self.none_token + 1

    @property
    def vocab_size(self) -> int:
        return self.alphabet + len(self.hops) + (2 if self.tokens_targets else 0)

    def hop_token(self, k: Any) -> Any:
        """The token naming hop count `k` (or an array of them)."""
        return self.alphabet + (np.asarray(k) - self.min_hops)

    def letters(self, rng: np.random.Generator, rows: int, n: int) -> np.ndarray:
        """`rows` sequences of `n` letters: the first uniform, each next one uniform among the
        letters other than the one before it."""
        first = rng.integers(0, self.alphabet, size=(rows, 1))
        steps = rng.integers(1, self.alphabet, size=(rows, n - 1))  # never 0: no repeat
        return np.cumsum(np.concatenate([first, steps], axis=1), axis=1) % self.alphabet

    @staticmethod
    def held_out(letters: np.ndarray) -> np.ndarray:
        """Which sequences belong to validation: the parity of a fixed hash of their letters
        (sum_i X_i w_i mod 2^31 - 1, the weights w drawn once from a fixed seed), so a sequence
        is on one side whatever stream drew it."""
        n = letters.shape[1]
        weights = np.random.default_rng([_TASK_KEY, n]).integers(1, _PRIME, size=n)
        return ((letters * weights % _PRIME).sum(axis=1) % _PRIME) % 2 == 1

    def draw(self, rng: np.random.Generator, ks: np.ndarray, n: int, held_out: bool
             ) -> tuple[np.ndarray, np.ndarray]:
        """Sequences of `n` letters, one per hop count of `ks`, each with at least one answer
        (unless positions without one have a target token) and on the `held_out` side of the
        split; returns (letters, answers), answers `NULL` where undefined. A row is drawn again
        until it qualifies (twice on average when answers are common); `DataError` when one
        never does."""
        rows = len(ks)
        letters = np.empty((rows, n), dtype=np.int64)
        answers = np.empty((rows, n), dtype=np.int64)
        todo = np.arange(rows)
        for _ in range(_MAX_DRAWS):
            cand = self.letters(rng, len(todo), n)
            ans = hop(cand, ks[todo])
            ok = self.held_out(cand) == held_out
            if not self.tokens_targets:
                ok &= (ans != NULL).any(axis=1)
            letters[todo[ok]], answers[todo[ok]] = cand[ok], ans[ok]
            todo = todo[~ok]
            if not len(todo):
                return letters, answers
        k = int(ks[todo[0]])
        raise DataError(f"khop: {_MAX_DRAWS} draws of {n} letters gave no position with a "
                        f"{k}-hop answer; raise data.seq_len (or lower data.khop_max_hops)")

    def batch(self, rng: np.random.Generator, ks: np.ndarray, seq_len: int, held_out: bool
              ) -> Batch:
        """(x, y) int64 tensors [rows, seq_len] in the layout of the module docstring."""
        letters, answers = self.draw(rng, ks, seq_len - 1, held_out)
        x = np.concatenate([self.hop_token(ks)[:, None], letters], axis=1)
        first, none = ((self.blank_token, self.none_token) if self.tokens_targets
                       else (IGNORE, IGNORE))
        y = np.concatenate([np.full((len(ks), 1), first), np.where(
            answers == NULL, none, answers)], axis=1)
        return torch.from_numpy(x).long(), torch.from_numpy(y).long()


class KhopSampler:
    """Batches `(x, y)` of shape `[batch_size, seq_len]` for step `i`, a function of (seed,
    stream, i) alone, as `normlab.data.BatchSampler`'s are: `batch(i)` is the same whenever and
    in whatever order it is called. `split="train"` draws each sequence's hop count uniformly;
    `"val"` gives every hop count the same share (row r of batch i: the ((i * batch_size + r) mod
    H)-th of the H hop counts) and draws on the held-out side of the split."""

    def __init__(self, task: KhopTask, batch_size: int, seq_len: int, seed: int,
                 split: str = "train") -> None:
        if split not in _STREAM:
            raise ValueError(f"split: {split!r} is not one of {', '.join(_STREAM)}")
        if seq_len < task.max_hops + 3:
            raise DataError(f"seq_len={seq_len} is too short for {task.max_hops} hops; use at "
                            f"least {task.max_hops + 3}")
        self.task, self.batch_size, self.seq_len = task, batch_size, seq_len
        self.seed, self.split = seed, split

    def hop_counts(self, rng: np.random.Generator, step: int) -> np.ndarray:
        hops = np.asarray(self.task.hops, dtype=np.int64)
        if self.split == "train":
            return rng.choice(hops, size=self.batch_size)
        return hops[(step * self.batch_size + np.arange(self.batch_size)) % len(hops)]

    def batch(self, step: int) -> Batch:
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
            raise DataError(f"step must be a non-negative integer, got {step!r}")
        rng = np.random.default_rng([_TASK_KEY, self.seed, _STREAM[self.split], int(step)])
        ks = self.hop_counts(rng, int(step))
        return self.task.batch(rng, ks, self.seq_len, held_out=self.split == "val")

    __call__ = batch


# -- the metric --------------------------------------------------------------------------------
class HopAccuracy:
    """Accumulates, over evaluation batches, the answered positions and the correct ones per hop
    count, kept on the device (no host sync until `values`).

    `add(x, y, logits)` takes one model's batch (`x`, `y` [B, T], logits [B, T, V]) or M stacked
    models' (`[M, B, T]`, logits `[M, B, T, V]`); the hop count of a row is read from its first
    token."""

    def __init__(self, task: KhopTask) -> None:
        self.task = task
        self._counts: torch.Tensor | None = None  # [M, H, 2]: correct, answered

    def add(self, x: torch.Tensor, y: torch.Tensor, logits: torch.Tensor) -> None:
        if x.dim() == 2:
            x, y, logits = x[None], y[None], logits[None]
        hop_index = (x[..., 0] - self.task.alphabet).long()            # [M, B]
        which = torch.nn.functional.one_hot(hop_index, len(self.task.hops)).double()
        answered = (y >= 0) & (y < self.task.alphabet)  # letters: never -100 or a token
        correct = (logits.argmax(-1) == y) & answered
        per_row = torch.stack([correct.sum(-1), answered.sum(-1)], dim=-1).double()  # [M, B, 2]
        counts = torch.einsum("mbh,mbc->mhc", which, per_row)
        self._counts = counts if self._counts is None else self._counts + counts

    def values(self, dist: Any = None) -> list[dict[str, float]]:
        """Per model: `val_acc` over every answered position, and `val_acc_hop{k}` per hop count
        k that had answered positions (over all ranks' shards in a process group)."""
        if self._counts is None:
            raise ValueError("HopAccuracy: no batch was added")
        counts = self._counts if dist is None else dist.mean(self._counts)
        out = []
        for member in counts.cpu().tolist():
            correct = sum(c for c, _ in member)
            answered = sum(a for _, a in member)
            row = {"val_acc": correct / answered if answered else math.nan}
            row.update({f"val_acc_hop{k}": c / a for k, (c, a) in zip(
                self.task.hops, member, strict=True) if a})
            out.append(row)
        return out


# -- the data of a run -------------------------------------------------------------------------
@dataclass(frozen=True)
class KhopData:
    """The data of a run with `data.task: khop`, with the interface of `normlab.data.TextData`
    that the trainers use."""

    task: KhopTask

    def sampler(self, batch_size: int, seq_len: int, seed: int) -> KhopSampler:
        return KhopSampler(self.task, batch_size, seq_len, seed, "train")

    def val_batches(self, batch_size: int, seq_len: int, n_batches: int, seed: int
                    ) -> list[Batch]:
        sampler = KhopSampler(self.task, batch_size, seq_len, seed, "val")
        return [sampler.batch(i) for i in range(n_batches)]

    @property
    def unigram_entropy(self) -> float:
        """The loss of the best predictor that ignores the context: the answers are uniform over
        the letters (the generator treats the letters alike), so ln(alphabet). With target
        tokens for the positions without an answer (`unanswered: token`) the same number is
        kept: the loss then also counts the "blank" and "does not exist" targets, which are
        easier than the letters, so the stall rule (`normlab.train.diagnostics.stalled`) asks
        less of such a run; C14's calibration reads the accuracy per hop count, not the rule."""
        return math.log(self.task.alphabet)

    def accuracy(self) -> HopAccuracy:
        return HopAccuracy(self.task)

    def bits_per_byte(self, loss: float) -> None:
        """The task's tokens are not text: no bits per byte."""
        return None

    def save_tokenizer(self, run_dir: Any) -> None:
        """The task's tokens need no tokenizer file."""

    def check_vocab(self, model_vocab: int) -> None:
        """The config checks the task's vocabulary (`normlab.config.task_model_problems`)."""

    @property
    def masked_targets(self) -> bool:
        """Positions without an answer have target -100: the trainers weight losses by the
        answered positions (`normlab.train.step.accumulate_gradients`); with target tokens there
        (`unanswered: token`) every position counts, as in the authors' mean loss."""
        return not self.task.tokens_targets

    @property
    def fingerprint(self) -> None:
        """Generated data reads no files: nothing to fingerprint (see `TextData.fingerprint`)."""
        return None

    def meta(self) -> dict[str, Any]:
        """What config.yaml's `meta` records about the data."""
        t = self.task
        out = {"task": "khop", "letters": f"tokens 0..{t.alphabet - 1}",
               "hop_tokens": {k: int(t.hop_token(k)) for k in t.hops}}
        if t.tokens_targets:
            out.update(none_token=t.none_token, blank_token=t.blank_token)
        return out
