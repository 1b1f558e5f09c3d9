"""The k-hop induction heads task (`data.task: khop`, normlab/data/khop.py): its answers, its
batches, its config, and a training run that reports the accuracy per hop count."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from normlab.config import ConfigError, RunConfig, load_run_config
from normlab.data import KhopData, KhopTask, load_run_data
from normlab.data.khop import (
    IGNORE,
    NULL,
    HopAccuracy,
    KhopSampler,
    find_positions,
    hop,
    hop_positions,
)
from normlab.nn import build_model
from normlab.train import read_summary, train_run
from normlab.train.group import train_group
from normlab.train.logging import read_metrics

# A sequence worked by hand (positions 0..7):     X = 0 1 2 0 2 1 0 1
#   find (1 + last earlier occurrence):               - - - 1 3 2 4 6
#   hop_1 = X[find]:                                  - - - 1 0 2 2 0
#   hop_2 = X[find(find)]: find(1), find(2) are -,    - - - - 1 - 0 2
#   so positions 3 and 5 have a 1-hop answer but no 2-hop one.
X = [0, 1, 2, 0, 2, 1, 0, 1]
N = NULL


def reference_hop(x: list[int], k: int) -> list[int]:
    """hop_k written out from the definition, one position at a time."""
    out = []
    for i in range(len(x)):
        pos = i
        for _ in range(k):
            earlier = [j for j in range(pos) if x[j] == x[pos]]
            if not earlier:
                pos = None
                break
            pos = earlier[-1] + 1
        out.append(NULL if pos is None else x[pos])
    return out


# -- the definition --------------------------------------------------------------------------------
def test_find_and_hops_of_a_sequence_worked_by_hand():
    assert find_positions(X).tolist() == [N, N, N, 1, 3, 2, 4, 6]
    assert hop(X, 1).tolist() == [N, N, N, 1, 0, 2, 2, 0]
    assert hop(X, 2).tolist() == [N, N, N, N, 1, N, 0, 2]
    assert hop(X, 0).tolist() == X


def test_one_hop_is_the_induction_head_answer():
    """hop_1 at i is the letter that followed the last earlier occurrence of X_i: what an
    induction head predicts after reading X_i."""
    rng = np.random.default_rng(0)
    for _ in range(20):
        x = rng.integers(0, 3, size=12).tolist()
        answers = hop(x, 1).tolist()
        for i in range(len(x)):
            earlier = [j for j in range(i) if x[j] == x[i]]
            assert answers[i] == (x[earlier[-1] + 1] if earlier else NULL)


def test_two_hops_compose_find_with_itself():
    rng = np.random.default_rng(1)
    for _ in range(20):
        x = rng.integers(0, 4, size=16)
        f = find_positions(x)
        twice = np.where(f >= 0, f[np.maximum(f, 0)], NULL)
        assert hop_positions(x, 2).tolist() == twice.tolist()
        assert hop(x, 2).tolist() == np.where(twice >= 0, x[np.maximum(twice, 0)], NULL).tolist()


def test_positions_without_an_earlier_occurrence_have_no_answer():
    x = [2, 0, 1, 3, 0, 2, 0]  # first occurrences at 0, 1, 2, 3
    for k in (1, 2, 3):
        assert hop(x, k)[:4].tolist() == [N] * 4
    assert find_positions(x).tolist() == [N, N, N, N, 2, 1, 5]
    assert hop(x, 1).tolist() == [N, N, N, N, 1, 0, 2]
    # 6 -> 5 -> 1 lands on a letter; 4 -> 2 and 5 -> 1 land on first occurrences, and a third
    # hop from 6 would leave 1, which has none
    assert hop(x, 2).tolist() == [N, N, N, N, N, N, 0]
    assert hop(x, 3).tolist() == [N] * 7


def test_the_vectorized_hops_match_the_definition_for_every_k():
    rng = np.random.default_rng(2)
    batch = rng.integers(0, 3, size=(16, 14))  # adjacent repeats included
    ks = rng.integers(0, 6, size=16)
    got = hop(batch, ks)
    for row, k, answers in zip(batch.tolist(), ks.tolist(), got.tolist(), strict=True):
        assert answers == reference_hop(row, k)


# -- batches ---------------------------------------------------------------------------------------
TASK = KhopTask(alphabet=4, min_hops=1, max_hops=3)


def test_a_batch_holds_the_hop_token_the_letters_and_their_answers():
    sampler = KhopSampler(TASK, batch_size=16, seq_len=24, seed=0)
    x, y = sampler.batch(0)
    assert x.shape == y.shape == (16, 24) and x.dtype == y.dtype == torch.int64
    ks = x[:, 0].numpy() - TASK.alphabet + TASK.min_hops
    assert set(ks.tolist()) <= {1, 2, 3}
    letters = x[:, 1:].numpy()
    assert letters.min() >= 0 and letters.max() < TASK.alphabet
    assert (letters[:, 1:] != letters[:, :-1]).all()  # no letter follows itself
    assert (y[:, 0] == IGNORE).all()
    want = hop(letters, ks)
    assert y[:, 1:].tolist() == np.where(want == NULL, IGNORE, want).tolist()
    assert ((y != IGNORE).sum(1) > 0).all()  # every sequence has an answer
    short = KhopSampler(TASK, batch_size=64, seq_len=6, seed=1).batch(0)[1]  # often none there
    assert ((short != IGNORE).sum(1) > 0).all()
    assert TASK.vocab_size == 7 and int(x.max()) < TASK.vocab_size
    # training sequences draw their hop count uniformly: 320 draws, about 107 of each
    drawn = torch.cat([sampler.batch(step)[0][:, 0] for step in range(20)]) - TASK.alphabet
    counts = torch.bincount(drawn).tolist()
    assert len(counts) == 3 and min(counts) > 75, counts


def test_the_same_seed_gives_the_same_batches_in_any_order():
    a = KhopSampler(TASK, 8, 20, seed=3)
    b = KhopSampler(TASK, 8, 20, seed=3)
    later = b.batch(5)
    for step in (0, 5, 2):
        xa, ya = a.batch(step)
        xb, yb = b.batch(step)
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert torch.equal(a.batch(5)[0], later[0])
    assert not torch.equal(a.batch(0)[0], a.batch(1)[0])
    assert not torch.equal(a.batch(0)[0], KhopSampler(TASK, 8, 20, seed=4).batch(0)[0])
    data = KhopData(TASK)
    assert all(torch.equal(p[0], q[0]) for p, q in zip(
        data.val_batches(8, 20, 3, seed=3), data.val_batches(8, 20, 3, seed=3), strict=True))


def test_validation_never_holds_a_training_sequence():
    """In a space of 3 * 2^4 = 48 letter sequences, 400 training and 160 validation draws would
    share many without the split."""
    task = KhopTask(alphabet=3, min_hops=1, max_hops=2)
    train = KhopSampler(task, 8, 6, seed=0)
    rows = {tuple(r) for s in range(50) for r in train.batch(s)[0][:, 1:].tolist()}
    held = {tuple(r) for r in torch.cat([b[0] for b in KhopData(task).val_batches(
        8, 6, 20, seed=0)])[:, 1:].tolist()}
    assert len(rows) > 5 and len(held) > 5
    assert not rows & held
    assert not KhopTask.held_out(np.array(sorted(rows))).any()
    assert KhopTask.held_out(np.array(sorted(held))).all()


def test_validation_gives_every_hop_count_the_same_share():
    batches = KhopData(TASK).val_batches(batch_size=5, seq_len=20, n_batches=3, seed=0)
    ks = torch.cat([x[:, 0] for x, _ in batches]) - TASK.alphabet + TASK.min_hops
    assert sorted(ks.tolist()) == [1] * 5 + [2] * 5 + [3] * 5


# -- config ----------------------------------------------------------------------------------------
KHOP = ["data.task=khop", "model.vocab_size=8", "data.seq_len=32", "model.max_seq_len=32"]


@pytest.mark.parametrize("overrides, words", [
    (["data.task=khpo"], r"data.task: Input should be 'khop', got 'khpo' "
                         r"\(did you mean 'khop'\?\)"),
    (["data.khop_max_hops=6"], r"data: khop_max_hops: only used with task=khop"),
    (KHOP + ["data.khop_min_hops=5"], r"khop_min_hops: 5 exceeds khop_max_hops=4"),
    (KHOP + ["data.seq_len=6"], r"data: seq_len: 6 is too short for khop_max_hops=4.*seq_len >= 7"),
    (KHOP + ["data.source=plays.txt"], r"data: source: not used with task=khop"),
    (KHOP + ["data.khop_alphabet=2"], r"data.khop_alphabet: Input should be greater than or "
                                      r"equal to 3"),
    (KHOP[:1] + KHOP[2:], r"model.vocab_size: 256 does not match data.task=khop, which has 8 "
                          r"tokens \(4 letters and 4 hop-count tokens for k = 1..4\); set "
                          r"model.vocab_size: 8"),
    (KHOP + ["data.khop_alphabet=6"], r"set model.vocab_size: 10"),
    (KHOP + ["model.kind=encoder"], r"model.kind: data.task=khop gives an answer at every "
                                    r"position; use kind: decoder"),
])
def test_config_errors_name_the_field(overrides, words):
    with pytest.raises(ConfigError, match=words):
        load_run_config(None, overrides)


def test_the_vocabulary_follows_the_task():
    cfg = load_run_config(None, KHOP + ["data.khop_min_hops=0", "data.khop_max_hops=6",
                                        "model.vocab_size=11"])
    assert cfg.data.task_vocab_size == 11 == load_run_data(cfg.data).task.vocab_size
    assert RunConfig().data.task_vocab_size is None


# Run ids of text configs computed before the task fields existed (main at 96f37ae): a field added
# to DataConfig must leave them as they are, or every recorded run would lose its folder.
RECORDED_IDS = {
    (): "pre-L6-d256-b018512572e8",
    ("data.source=[a.txt,b.txt]", "data.seq_len=32", "data.val_fraction=0.2",
     "data.split_seed=3", "model.max_seq_len=32"): "pre-L6-d256-4ec9789d60a3",
}


def test_text_run_ids_are_unchanged():
    for overrides, run_id in RECORDED_IDS.items():
        assert load_run_config(None, list(overrides)).run_id() == run_id
    for name, run_id in (("pre", "pre-L4-d64-f232085dca16"), ("post", "post-L4-d64-322829a68057"),
                         ("modern", "pre-L4-d64-57b5cc516a16")):
        # (the examples say `precision: auto` since they were first issued in fp32)
        assert load_run_config(f"examples/{name}.yaml", ["train.precision=fp32"]
                               ).run_id() == run_id


def test_every_task_setting_names_another_run():
    base = load_run_config(None, KHOP)
    ids = {base.run_id()}
    for extra in (["data.khop_alphabet=5", "model.vocab_size=9"], ["data.khop_min_hops=2",
                  "model.vocab_size=7"], ["data.khop_max_hops=5", "model.vocab_size=9"]):
        ids.add(load_run_config(None, KHOP + extra).run_id())
    assert len(ids) == 4
    # the run ids of a task hash its settings even at their defaults
    explicit = load_run_config(None, KHOP + ["data.khop_alphabet=4", "data.khop_max_hops=4"])
    assert explicit.run_id() == base.run_id()
    assert "khop_alphabet" in base.to_dict()["data"]


# -- metric and loss -------------------------------------------------------------------------------
def test_hop_accuracy_counts_answered_positions_per_hop_count():
    task = KhopTask(alphabet=3, min_hops=1, max_hops=2)
    h1, h2 = task.hop_token(1), task.hop_token(2)
    x = torch.tensor([[h1, 0, 1, 0], [h2, 1, 0, 1], [h2, 2, 0, 2]])
    y = torch.tensor([[IGNORE, IGNORE, IGNORE, 1], [IGNORE, IGNORE, 1, 0], [IGNORE, IGNORE, 2, 0]])
    pred = torch.tensor([[0, 0, 0, 1], [0, 0, 1, 2], [0, 1, 2, 0]])  # right: 1 of 1, 1 of 2, 2 of 2
    logits = torch.nn.functional.one_hot(pred, task.vocab_size).float()
    acc = HopAccuracy(task)
    acc.add(x, y, logits)
    assert acc.values() == [{"val_acc": 0.8, "val_acc_hop1": 1.0, "val_acc_hop2": 0.75}]
    acc.add(x[:1], y[:1], torch.zeros_like(logits[:1]))  # predicts letter 0: wrong
    assert acc.values()[0]["val_acc_hop1"] == 0.5
    never = torch.nn.functional.one_hot(torch.full_like(pred, h2), task.vocab_size).float()
    stacked = HopAccuracy(task)  # two stacked models, the second always wrong: [M, B, T]
    stacked.add(torch.stack([x, x]), torch.stack([y, y]), torch.stack([logits, never]))
    first, second = stacked.values()
    assert first["val_acc"] == 0.8 and second["val_acc"] == 0.0


def test_the_loss_ignores_positions_without_an_answer():
    cfg = load_run_config(None, KHOP + ["model.n_blocks=1", "model.d_model=16",
                                        "model.n_heads=2"])
    model = build_model(cfg.model, seed=0)
    x, y = KhopData(KhopTask.from_config(cfg.data)).sampler(4, 32, seed=0).batch(0)
    out = model(x, y)
    answered = y != IGNORE
    assert 0 < answered.sum() < y.numel()
    want = torch.nn.functional.cross_entropy(out.logits[answered].float(), y[answered])
    assert out.loss.item() == pytest.approx(want.item(), rel=1e-6)


# -- training --------------------------------------------------------------------------------------
TINY = KHOP + ["model.n_blocks=2", "model.d_model=32", "model.n_heads=2", "train.batch_size=8",
               "train.steps=6", "train.eval_every=3", "train.eval_batches=2", "train.log_every=1",
               "train.lr=3e-3", "train.device=cpu"]
HOP_KEYS = {f"val_acc_hop{k}" for k in (1, 2, 3, 4)}


def test_a_tiny_run_logs_the_accuracy_per_hop_count(tmp_path, capsys):
    cfg = load_run_config(None, TINY)
    s = train_run(cfg, tmp_path, progress=True)
    assert s["outcome"] in ("completed", "stalled") and s["step"] == 6
    assert s["unigram_entropy"] == pytest.approx(math.log(4))
    rows = read_metrics(tmp_path / s["run_id"] / "metrics.jsonl")
    evals = [r for r in rows if "val_loss" in r]
    assert [r["step"] for r in evals] == [3, 6]
    for r in evals:
        assert set(r) >= HOP_KEYS | {"val_acc"}
        assert all(0.0 <= r[k] <= 1.0 for k in HOP_KEYS | {"val_acc"})
        assert math.isfinite(r["val_loss"]) and math.isfinite(r["train_loss"])
    assert not any("val_acc" in r for r in rows if "val_loss" not in r)
    assert {k: s[k] for k in HOP_KEYS} == {k: evals[-1][k] for k in HOP_KEYS}
    lines = [line for line in capsys.readouterr().err.splitlines() if "step 6/6" in line]
    assert lines and f"acc {s['val_acc']:.2f} (k=1 {s['val_acc_hop1']:.2f}, k=2" in lines[0]
    meta = (tmp_path / s["run_id"] / "config.yaml").read_text()
    assert "task: khop" in meta and "train_works" not in meta


def test_a_resumed_khop_run_continues_exactly(tmp_path):
    cfg = load_run_config(None, TINY)
    full = train_run(cfg, tmp_path / "a", progress=False)
    part = train_run(cfg, tmp_path / "b", progress=False, interrupt_at=4)
    assert part["outcome"] == "interrupted"
    resumed = train_run(cfg, tmp_path / "b", progress=False)
    timing = ("time_s", "tokens_per_s")
    a, b = ([{k: v for k, v in r.items() if k not in timing} for r in read_metrics(
        root / cfg.run_id() / "metrics.jsonl")] for root in (tmp_path / "a", tmp_path / "b"))
    assert a == b
    assert resumed["val_acc"] == full["val_acc"]


def test_a_stacked_group_reports_each_members_accuracy(tmp_path):
    cfgs = [load_run_config(None, TINY + [f"train.lr={lr}"]) for lr in ("3e-3", "1e-2")]
    group = train_group(cfgs, tmp_path / "group")
    for cfg in cfgs:
        alone = train_run(cfg, tmp_path / "alone", progress=False)
        s = read_summary(tmp_path / "group" / cfg.run_id())
        assert s == group[cfg.run_id()] and s["engine"] == "stacked"
        assert set(s) >= HOP_KEYS
        assert s["val_loss"] == pytest.approx(alone["val_loss"], rel=1e-5)
        assert s["val_acc"] == pytest.approx(alone["val_acc"], abs=0.02)


def test_a_khop_run_is_listed_and_refused_by_the_text_commands(tmp_path):
    from typer.testing import CliRunner

    from normlab.cli import app
    from normlab.finetune import FinetuneError, finetune
    from normlab.train.sample import SampleError, sample_run

    s = train_run(load_run_config(None, TINY + ["train.steps=2"]), tmp_path, progress=False)
    run_dir = tmp_path / s["run_id"]
    with pytest.raises(SampleError, match="trained on data.task=khop, not text"):
        sample_run(run_dir)
    with pytest.raises(FinetuneError, match="trained on data.task=khop; the genre task reads"):
        finetune(run_dir, steps=1)
    r = CliRunner().invoke(app, ["probe", "--checkpoint", str(run_dir)])
    said = " ".join(r.output.split())  # the message wraps where the folder's path length puts it
    assert r.exit_code == 2 and "trained on data.task=khop; the probes read text" in said
    # `normlab runs` lists it, with its accuracy
    r = CliRunner().invoke(app, ["runs", str(tmp_path)])
    assert r.exit_code == 0 and "val acc" in r.output and f"{s['val_acc']:.4f}" in r.output


def test_a_sweep_over_khop_runs_trains_them_stacked(tmp_path):
    from normlab.sweep import plan_sweep, run_sweep

    base = load_run_config(None, TINY).to_dict()
    plan = plan_sweep({"name": "khop_lr", "base": base, "axes": {"train.lr": [1e-3, 3e-3]}})
    result = run_sweep(plan, tmp_path, workers=1, progress=False)
    assert result.ok and len(result.summaries) == 2
    for s in result.summaries.values():
        assert s["engine"] == "stacked" and set(s) >= HOP_KEYS


# -- the authors' targets (data.khop_unanswered: token; C14's calibration rung) ----------------
class SanfordGenerator:
    """The hop computation and the targets of Sanford et al.'s generator, written from their
    code (github.com/chsanford/hop-induction-heads at 5735bca, src/tasks.py,
    `InductionHopsFullSequenceTask.get_strings`), on a string of letters given instead of drawn:
    the answers by `str.rfind` over the string, the input the hop character and the string less
    its last two letters, the output a blank and the k-hop string less its last two."""

    BLANK, NONE = "_", "~"

    def __init__(self, char_tokens: int = 4, min_hops: int = 0, max_hops: int = 16) -> None:
        self.min_hops, self.max_hops = min_hops, max_hops
        self.chars = [chr(97 + i) for i in range(char_tokens)]
        induction_tokens = max_hops - min_hops + 1
        self.num_tokens = char_tokens + induction_tokens + 2
        self.blank_token_min = char_tokens + induction_tokens  # their error counts below this
        self.induction_token_map = {chr(i + 48): i - min_hops
                                    for i in range(min_hops, max_hops + 1)}
        self.token_map = {**self.induction_token_map,
                          **{c: i + induction_tokens for i, c in enumerate(self.chars)},
                          self.BLANK: self.num_tokens - 1, self.NONE: self.num_tokens - 2}

    def strings(self, random_char_string: str, num_hops: int) -> tuple[str, str]:
        seq_len = len(random_char_string)
        hop_strings, hop_indices = [random_char_string], [range(seq_len)]
        for _ in range(self.max_hops + 1):
            last_string, last_indices = hop_strings[-1], hop_indices[-1]
            new_string, new_indices = "", []
            for i in range(seq_len):
                if last_indices[i] == -1 or (last_index := random_char_string[
                        :last_indices[i]].rfind(last_string[i])) == -1:
                    new_string += self.NONE
                    new_indices.append(-1)
                else:
                    new_string += random_char_string[last_index + 1]
                    new_indices.append(last_index + 1)
            hop_strings.append(new_string)
            hop_indices.append(new_indices)
        inv = {t: c for c, t in self.induction_token_map.items()}  # their bidict's `.inv`
        hop_char = inv[num_hops - self.min_hops]
        return (hop_char + random_char_string[:-2],
                self.BLANK + hop_strings[num_hops][:-2])


SANFORD = KhopTask(alphabet=4, min_hops=0, max_hops=16, unanswered="token")


def _their_labels(gen: SanfordGenerator, letters: list[int], k: int) -> list[str]:
    """Their output string for our letters: two letters appended (they draw seq_len letters and
    drop the last two, which no earlier answer reads), each unlike the one before it."""
    tail = [(letters[-1] + 1) % 4]
    tail.append((tail[0] + 1) % 4)
    text = "".join(gen.chars[c] for c in letters + tail)
    _inp, out = gen.strings(text, k)
    assert _inp[1:] == text[:-2]
    return list(out)


@pytest.mark.parametrize("split", ["train", "val"])
def test_the_authors_targets_match_their_generator(split):
    gen = SanfordGenerator()
    sampler = KhopSampler(SANFORD, batch_size=34, seq_len=99, seed=2, split=split)
    assert SANFORD.vocab_size == gen.num_tokens == 23
    seen = set()
    for step in range(2):
        x, y = sampler.batch(step)
        assert x.shape == (34, 99)  # their seq_len 100: the hop token and 98 letters
        for row_x, row_y in zip(x.tolist(), y.tolist(), strict=True):
            k = row_x[0] - SANFORD.alphabet + SANFORD.min_hops
            seen.add(k)
            mine = {SANFORD.blank_token: gen.BLANK, SANFORD.none_token: gen.NONE,
                    **{i: gen.chars[i] for i in range(4)}}
            assert [mine[t] for t in row_y] == _their_labels(gen, row_x[1:], k)
            # the letters their error counts (`output < blank_token_min`) are ours answered
            theirs = [gen.token_map[c] < gen.blank_token_min for c in
                      _their_labels(gen, row_x[1:], k)]
            assert theirs == [0 <= t < SANFORD.alphabet for t in row_y]
    assert seen == set(range(17)) or split == "train"


def test_the_generator_is_checked_against_a_sequence_worked_by_hand():
    gen = SanfordGenerator(char_tokens=3, min_hops=0, max_hops=2)
    # X = 0 1 2 0 2 1 0 1 (the sequence worked by hand above): hop_1 = - - - 1 0 2 2 0
    assert gen.strings("abcacbab" + "ca", 1)[1] == "_~~~bacca"
    assert gen.strings("abcacbab" + "ca", 2)[1] == "_~~~~b~ac"
    assert gen.strings("abcacbab" + "ca", 0)[1] == "_abcacbab"


def test_ignored_or_token_targets_differ_only_where_there_is_no_answer():
    ignore = KhopTask(alphabet=4, min_hops=0, max_hops=16)
    a = KhopSampler(ignore, 16, 99, seed=1).batch(0)
    b = KhopSampler(SANFORD, 16, 99, seed=1).batch(0)
    assert torch.equal(a[0], b[0])  # the same sequences (none lacks an answer at this length)
    ya, yb = a[1], b[1]
    assert torch.equal(ya[ya != IGNORE], yb[ya != IGNORE])
    assert (yb[:, 0] == SANFORD.blank_token).all()
    assert (yb[:, 1:][ya[:, 1:] == IGNORE] == SANFORD.none_token).all()
    data = KhopData(SANFORD)
    assert not data.masked_targets and KhopData(ignore).masked_targets
    assert data.meta()["none_token"] == 21 and data.meta()["blank_token"] == 22


def test_the_accuracy_counts_letters_only_with_token_targets():
    task = KhopTask(alphabet=3, min_hops=1, max_hops=2, unanswered="token")
    h1 = task.hop_token(1)
    x = torch.tensor([[h1, 0, 1, 0]])
    y = torch.tensor([[task.blank_token, task.none_token, task.none_token, 1]])
    pred = torch.tensor([[task.blank_token, task.none_token, 0, 1]])  # the letter right
    acc = HopAccuracy(task)
    acc.add(x, y, torch.nn.functional.one_hot(pred, task.vocab_size).float())
    assert acc.values() == [{"val_acc": 1.0, "val_acc_hop1": 1.0}]


def test_token_targets_are_a_setting_of_the_task_and_of_its_run_id():
    base = load_run_config(None, KHOP)
    same = load_run_config(None, KHOP + ["data.khop_unanswered=ignore"])
    assert same.run_id() == base.run_id()  # the default leaves every khop run's id as it was
    token = load_run_config(None, KHOP[:1] + ["model.vocab_size=10"] + KHOP[2:]
                            + ["data.khop_unanswered=token"])
    assert token.run_id() != base.run_id() and token.data.task_vocab_size == 10
    with pytest.raises(ConfigError, match=r"khop_unanswered: only used with task=khop"):
        load_run_config(None, ["data.khop_unanswered=token"])
    with pytest.raises(ConfigError, match=r"and 2 target tokens\); set model.vocab_size: 10"):
        load_run_config(None, KHOP + ["data.khop_unanswered=token"])
    with pytest.raises(ValueError, match="unanswered"):
        KhopTask(unanswered="drop")


def test_a_tiny_run_with_token_targets_trains_and_reports_letters(tmp_path):
    cfg = load_run_config(None, TINY[:1] + ["model.vocab_size=10"] + TINY[2:]
                          + ["data.khop_unanswered=token", "train.steps=3", "train.eval_every=3"])
    s = train_run(cfg, tmp_path, progress=False)
    assert s["outcome"] in ("completed", "stalled") and s["step"] == 3
    assert set(s) >= HOP_KEYS and 0.0 <= s["val_acc"] <= 1.0
