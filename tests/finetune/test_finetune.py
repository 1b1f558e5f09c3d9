"""The genre task (normlab.data.genre), its n-gram baseline, and fine-tuning (normlab.finetune)."""

from __future__ import annotations

import collections
import dataclasses
import json
import re

import numpy as np
import pytest
import torch
import typer
from typer.testing import CliRunner

from normlab.cli.finetune import finetune_command
from normlab.data import DataError, shakespeare_works
from normlab.data.genre import (
    EXCLUDED_WORKS,
    FOLIO_GENRES,
    GENRES,
    clean_play,
    evaluation_rows,
    folio_plays,
    genre_task,
    naive_bayes_baseline,
    play_texts,
)
from normlab.finetune import FinetuneError, finetune, finetune_model
from normlab.train.checkpoint import CheckpointError


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A tiny pretrained decoder run folder: 2 blocks, d 32, 20 steps."""
    from normlab.config import load_run_config
    from normlab.train import train_run

    root = tmp_path_factory.mktemp("runs")
    cfg = load_run_config(None, [
        "model.n_blocks=2", "model.d_model=32", "model.n_heads=2", "model.max_seq_len=64",
        "data.seq_len=64", "train.batch_size=8", "train.steps=20", "train.eval_every=0",
        "train.eval_batches=2", "train.device=cpu"])
    summary = train_run(cfg, root, progress=False)
    assert summary["outcome"] == "stalled" and summary["step"] == 20  # short: no context learned
    return root / summary["run_id"]


def small_task(task: str = "genre", n_train: int = 256, n_test: int = 96):
    """The real task with fewer passages (every k-th test row), for fast fine-tuning tests."""
    full = genre_task(task, passage_bytes=64)
    step = len(full.test_y) // n_test
    return dataclasses.replace(
        full, train_x=full.train_x[:n_train], train_y=full.train_y[:n_train],
        train_play=full.train_play[:n_train], train_offset=full.train_offset[:n_train],
        test_x=full.test_x[::step], test_y=full.test_y[::step],
        test_play=full.test_play[::step], test_offset=full.test_offset[::step])


# -- the task -------------------------------------------------------------------------------
def test_folio_plays_and_labels():
    names = {w.name for w in shakespeare_works()}
    assert len(folio_plays()) == 36 == len(GENRES)
    assert collections.Counter(GENRES.values()) == {"comedy": 14, "history": 10, "tragedy": 12}
    assert set(GENRES) <= names
    assert names - set(GENRES) == set(EXCLUDED_WORKS)
    assert "pericles" in EXCLUDED_WORKS and "sonnets" in EXCLUDED_WORKS
    assert sum(len(v) for v in FOLIO_GENRES.values()) == 36
    task = genre_task("genre")
    assert task.classes == ["comedy", "history", "tragedy"]
    for play, genre in (("hamlet", "tragedy"), ("cymbeline", "tragedy"), ("henry_v", "history"),
                        ("tempest", "comedy"), ("winters_tale", "comedy")):
        p = task.plays.index(play)
        labels = set(task.train_y[task.train_play == p]) | set(task.test_y[task.test_play == p])
        assert labels == {task.classes.index(genre)}
    play = genre_task("play")
    assert play.n_classes == 36 and set(play.test_y) == set(range(36))
    assert play.classes[play.test_y[0]] == play.plays[play.test_play[0]]


SAMPLE = b"""THE TRAGEDY OF SAMPLE

DRAMATIS PERSONAE

KING, a king.
Ham., his son.

SCENE. Elsinore.



ACT I.

Scene I. A platform. The heading goes on
on a second line.

[Enter KING and HAMLET,
with [many] attendants.]

KING.
First speech line,
second line.

Ham.
[Aside.] Aside speech.

1 Clown.
A clown speaks.

KING. Inline speech.

Ham. and King.
Together now.

[Exeunt.]

THE END
"""


def test_clean_play_keeps_only_speech():
    assert clean_play(SAMPLE) == (b"First speech line, second line. Aside speech. "
                                  b"A clown speaks. Inline speech. Together now.")
    with pytest.raises(DataError, match="ACT"):
        clean_play(b"Shall I compare thee to a summer's day?\n")


def _frequent_caps_headings(raw: bytes) -> set[str]:
    """Independent rule: all-caps lines ending in '.' after a blank line, seen 5+ times."""
    lines = raw.decode("latin-1").split("\n")
    count = collections.Counter(
        lines[i].strip() for i in range(1, len(lines))
        if not lines[i - 1].strip() and re.fullmatch(r"[A-Z][A-Z .'&-]+\.", lines[i].strip()))
    return {h for h, n in count.items() if n >= 5}


def test_passages_have_no_stage_directions_or_headings():
    texts = play_texts()
    raw = {w.name: w.text for w in shakespeare_works()}
    task = genre_task("genre")
    for x in (task.train_x, task.test_x):
        assert x.dtype == np.uint8 and x.shape[1] == 256
        for byte in b"[]{}\n":
            assert not (x == byte).any(), chr(byte)
    checked = 0
    for play, text in texts.items():
        s = " " + text.decode("latin-1") + " "
        assert "  " not in s[1:-1]
        assert not re.search(r"\b(?:ACT|Act|SCENE|Scene) (?:[IVX]+|\d+)\.", s), play
        assert "Dramatis Personae" not in s and "DRAMATIS PERSONAE" not in s
        for heading in _frequent_caps_headings(raw[play]):
            assert f" {heading} " not in s, (play, heading)
            checked += 1
    assert checked > 300  # the rule found the headings of the all-caps plays


def test_train_and_test_come_from_disjoint_ranges():
    texts = play_texts()
    task = genre_task("genre", passage_bytes=256, gap=1024)
    size = task.passage_bytes
    for p, play in enumerate(task.plays):
        train_end, test_start, length = task.bounds[play]
        assert length == len(texts[play]) and test_start == train_end + 1024
        assert abs(train_end - 0.8 * length) <= 1
        tr = np.sort(task.train_offset[task.train_play == p])
        te = np.sort(task.test_offset[task.test_play == p])
        assert len(tr) > 100 and len(te) > 20
        assert tr.min() >= 0 and tr.max() + size <= train_end
        assert te.min() >= test_start and te.max() + size <= length
        assert np.all(np.diff(tr) >= size) and np.all(np.diff(te) >= size)  # no overlap
    data = {play: np.frombuffer(texts[play], dtype=np.uint8) for play in task.plays}
    for x, play_idx, offs in ((task.train_x, task.train_play, task.train_offset),
                              (task.test_x, task.test_play, task.test_offset)):
        for i in range(0, len(x), 97):
            play = task.plays[play_idx[i]]
            assert np.array_equal(x[i], data[play][offs[i]:offs[i] + size])
    assert genre_task("genre", seed=0) is task  # cached, deterministic
    other = genre_task("genre", seed=1)
    assert not np.array_equal(other.train_y, task.train_y)  # seed shuffles training rows
    assert np.array_equal(np.sort(other.train_offset), np.sort(task.train_offset))
    assert np.array_equal(other.test_x, task.test_x)
    with pytest.raises(DataError, match="task"):
        genre_task("author")
    with pytest.raises(DataError, match="gap"):
        genre_task("genre", gap=10**6)


def test_naive_bayes_beats_chance():
    genre = naive_bayes_baseline(genre_task("genre"))
    assert genre["chance"] == pytest.approx(1 / 3)
    assert genre["test_accuracy"] > 0.5
    play = naive_bayes_baseline(genre_task("play"))
    assert play["test_accuracy"] > 0.2 > 5 * play["chance"]
    # scored on the same evenly spaced test passages that fine-tuning with test_max scores
    task = genre_task("genre")
    some = naive_bayes_baseline(task, test_max=200)
    assert some["n_test"] == 200 < genre["n_test"]
    rows = evaluation_rows(len(task.test_y), 200)
    assert rows[0] == 0 and rows[-1] == len(task.test_y) - 1 and len(set(rows.tolist())) == 200


# -- fine-tuning ----------------------------------------------------------------------------
def test_finetune_run_writes_and_reuses_results(tiny_run):
    kw = dict(steps=4, lr=1e-3, batch_size=8, warmup=1, passage_bytes=64, device="cpu",
              train_eval_max=64, test_max=200)
    first = finetune(tiny_run, task="genre", **kw)
    assert first["cached"] is False and first["outcome"] == "completed"
    assert 0.0 <= first["test_accuracy"] <= 1.0 and 0.0 <= first["train_accuracy"] <= 1.0
    assert first["n_test"] == 200 < len(genre_task("genre", passage_bytes=64).test_y)
    assert len(first["loss_curve"]) == 4 and first["checkpoint_step"] == 20
    path = tiny_run / "finetune" / first["path"].rsplit("/", 1)[-1]
    assert path.exists() and path.name.startswith("genre-")
    stored = json.loads(path.read_text())
    assert stored["test_accuracy"] == first["test_accuracy"] and "cached" not in stored
    # A second call must read the file, not train: a planted number comes back.
    path.write_text(json.dumps(stored | {"test_accuracy": -1.0}))
    again = finetune(tiny_run, task="genre", **kw)
    assert again["cached"] is True and again["test_accuracy"] == -1.0
    # Other settings (or from init) are other files.
    other = finetune(tiny_run, task="genre", **(kw | {"seed": 1}))
    init = finetune(tiny_run, task="genre", from_init=True, **kw)
    assert len({first["path"], other["path"], init["path"]}) == 3
    assert init["from_init"] is True and init["checkpoint_step"] is None
    assert "init-" in init["path"]


def test_finetune_model_is_deterministic_and_leaves_model_alone(tiny_run):
    from normlab.train import load_trained_model

    _, model = load_trained_model(tiny_run)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    task = small_task("play")
    kw = dict(steps=3, lr=1e-3, batch_size=8, warmup=1, device="cpu", seed=3)
    told: list[str] = []
    a = finetune_model(model, data=task, **kw)
    b = finetune_model(model, data=task, progress=told.append, **kw)
    assert a["loss_curve"] == b["loss_curve"]  # told or not, the same run
    assert told == [f"step {i}/3, train loss {a['loss_curve'][i - 1][1]:.4f}" for i in (1, 2, 3)
                    ] + [f"evaluating on {a['n_test']} test passages"]
    assert a["test_accuracy"] == b["test_accuracy"] and a["test_loss"] == b["test_loss"]
    assert a["confusion"] == b["confusion"]
    assert a["task"] == "play" and len(a["classes"]) == 36
    c = finetune_model(model, data=task, **(kw | {"seed": 4}))
    assert c["loss_curve"] != a["loss_curve"]
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    frozen = finetune_model(model, data=task, freeze=True, pooling="last", **kw)
    assert frozen["trainable_params"] == 32 * 36 + 36
    assert frozen["settings"]["pooling"] == "last"
    # from a model at init (no pretraining)
    from normlab.nn import build_model

    fresh = finetune_model(build_model(model.cfg, seed=0), data=task, **kw)
    assert 0.0 <= fresh["test_accuracy"] <= 1.0


def test_finetune_bad_input(tiny_run, tmp_path):
    with pytest.raises(FinetuneError, match="max_seq_len"):  # no window of 64 divides 100
        finetune(tiny_run, task="genre", steps=1, passage_bytes=100, device="cpu")
    with pytest.raises(FinetuneError, match="window=128 exceeds"):
        finetune(tiny_run, task="genre", steps=1, passage_bytes=256, window=128, device="cpu")
    with pytest.raises(FinetuneError, match="window: must divide"):
        finetune(tiny_run, task="genre", steps=1, passage_bytes=256, window=48, device="cpu")
    with pytest.raises(FinetuneError, match="task"):
        finetune(tiny_run, task="author", steps=1)
    with pytest.raises(FinetuneError, match="lr"):
        finetune(tiny_run, task="genre", steps=1, lr=-1.0)
    with pytest.raises(CheckpointError, match="no such run folder"):
        finetune(tmp_path / "nope", task="genre", steps=1)
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError):
        finetune(tmp_path / "empty", task="genre", steps=1)


def test_finetune_command(tiny_run):
    app = typer.Typer()
    app.command()(finetune_command)
    runner = CliRunner()
    r = runner.invoke(app, [str(tiny_run), "--steps", "2", "--passage-bytes", "64",
                            "--test-max", "100", "--device", "cpu"])
    assert r.exit_code == 0, r.output
    assert "fine-tuned" in r.output and "chance" in r.output
    assert "fine-tuning: step 2/2, train loss" in r.output  # told as it trains
    r = runner.invoke(app, [str(tiny_run), "--steps", "2", "--passage-bytes", "100",
                            "--device", "cpu"])
    assert r.exit_code == 2 and "max_seq_len" in r.output
    r = runner.invoke(app, [str(tiny_run), "--task", "author", "--device", "cpu"])
    assert r.exit_code == 2 and "task" in r.output


def test_finetune_command_reads_a_config_file_that_its_options_override(tiny_run, tmp_path):
    """`--config FILE.yaml` gives any FinetuneConfig field; an option given on the command line
    wins over the file; the result is the one `finetune` with that config stores."""
    app = typer.Typer()
    app.command()(finetune_command)
    runner = CliRunner()
    cfg_file = tmp_path / "ft.yaml"
    cfg_file.write_text("steps: 2\nbatch_size: 4\npassage_bytes: 64\ntest_max: 16\n"
                        "train_eval_max: 8\nstandardize: 8\nbeta2: 0.98\nseed: 5\n")
    r = runner.invoke(app, [str(tiny_run), "--config", str(cfg_file), "--seed", "6",
                            "--device", "cpu", "--no-baseline"])
    assert r.exit_code == 0, r.output
    stored = [json.loads(f.read_text())["settings"] for f in (tiny_run / "finetune").iterdir()]
    settings = next(s for s in stored if s["optimizer"] != "adamw(0.9,0.999,1e-8)")
    assert settings["seed"] == 6 and settings["steps"] == 2  # the option over the file's 5
    assert settings["optimizer"] == "adamw(0.9,0.98,1e-8)"
    assert settings["standardize"] == 8 and settings["lr"] == 3e-4  # the file's, the default
    cfg_file.write_text("steps: 2\nbeta2: 1.5\nstep: 3\n")
    r = runner.invoke(app, [str(tiny_run), "--config", str(cfg_file), "--device", "cpu"])
    said = " ".join(r.output.split())
    assert r.exit_code == 2 and "beta2" in said and "less than 1" in said
    assert "step: unknown field (did you mean 'steps'?)" in said
    r = runner.invoke(app, [str(tiny_run), "--config", str(tmp_path / "none.yaml")])
    assert r.exit_code == 2 and "none.yaml: not found" in " ".join(r.output.split())


def test_finetune_many_on_workers_gives_the_sequential_results(tiny_run, tmp_path):
    """Fine-tunes of one run as a stacked group and a frozen probe apart, on two spawned
    workers, give what one process gives, and are cached; the group's members are their
    fine-tunings alone within float rounding."""
    import shutil

    from normlab.finetune import finetune_many

    copy = tmp_path / tiny_run.name
    shutil.copytree(tiny_run, copy)
    small = dict(task="genre", steps=2, batch_size=4, passage_bytes=64, test_max=8,
                 train_eval_max=4, standardize=8, device="cpu")
    jobs = [(copy, small | {"seed": 0}), (copy, small | {"seed": 1, "lr": 1e-3}),
            (copy, small | {"freeze": True, "lrs": [1e-2, 1e-1]})]
    told: list[str] = []
    parallel = finetune_many(jobs, workers=2, log=told.append)
    assert told == ["2 fine-tunings in 1 stacked group(s) (2), 1 apart",
                    "2 fine-tuning(s) alone: finetune.freeze=True (a frozen body (a linear "
                    "probe: its features are computed once for all its lrs, and each head "
                    "trains on them alone) is not implemented by the stacked engine: the "
                    "fine-tuning trains alone)"]
    assert [r["cached"] for r in parallel[:2]] == [False, False]
    assert [(r["engine"], r["group_size"]) for r in parallel[:2]] == [("stacked", 2)] * 2
    assert [r["cached"] for r in parallel[2]] == [False, False] and "engine" not in parallel[2][0]
    again = finetune_many(jobs, workers=1)
    assert [r["cached"] for r in again[:2]] == [True, True]
    for a, b in zip([*parallel[:2], *parallel[2]], [*again[:2], *again[2]], strict=True):
        assert a["test_accuracy"] == b["test_accuracy"] and a["loss_curve"] == b["loss_curve"]
    fresh = finetune(copy, **small | {"seed": 1, "lr": 1e-3}, force=True)
    assert "engine" not in fresh  # one fine-tuning trains alone
    assert_same_finetuning(parallel[1], fresh)


def assert_same_finetuning(got, alone):
    """A stacked member's result against the same fine-tuning alone, as tests/train/
    test_batched.py compares a group's runs with runs alone: the same steps, outcome, settings
    and scores of every passage (accuracies and confusion: argmaxes, exact), and losses within
    float rounding (the stack's products and the fused optimizer round differently)."""
    for key in ("settings", "outcome", "steps_done", "test_accuracy", "train_accuracy",
                "val_accuracy", "confusion", "per_class_test_accuracy", "n_test", "n_val",
                "n_train_eval", "trainable_params", "model"):
        assert got[key] == alone[key], key
    assert [p[0] for p in got["loss_curve"]] == [p[0] for p in alone["loss_curve"]]
    for a, b in zip(got["loss_curve"], alone["loss_curve"], strict=True):
        if isinstance(b[1], str):  # the diverged step's loss, as text
            assert a[1] == b[1]
        else:
            assert a[1] == pytest.approx(b[1], rel=1e-4, abs=1e-6), a[0]
        assert a[2] == b[2]  # the lr: the same schedule
    for key in ("test_loss", "train_eval_loss", "val_loss"):
        if isinstance(alone[key], float):
            assert got[key] == pytest.approx(alone[key], rel=1e-4, abs=1e-6), key
        else:
            assert got[key] == alone[key], key


def test_an_lr_grid_gives_each_lr_s_own_run_and_a_frozen_one_shares_the_features(tiny_run,
                                                                                  tmp_path):
    """`finetune_model_lrs` gives, lr by lr, what `finetune_model` gives (a frozen body's
    features computed once for all of them); `finetune_lrs` stores each lr's result in the
    file `finetune` at that lr reads, and trains only the lrs not stored yet."""
    import shutil

    from normlab.finetune import finetune_lrs, finetune_many, finetune_model_lrs
    from normlab.train import load_trained_model

    _, model = load_trained_model(tiny_run)
    task = small_task("genre")
    kw = dict(steps=4, batch_size=8, warmup=1, device="cpu", seed=2, standardize=32)
    for freeze in (True, False):
        # (a body at lr 1e-1 blows up, and amplifies the stack's rounding past any tolerance)
        lrs = [1e-3, 1e-1] if freeze else [1e-3, 1e-2]
        together = finetune_model_lrs(model, data=task, lrs=lrs, freeze=freeze, **kw)
        alone = [finetune_model(model, data=task, lr=lr, freeze=freeze, **kw) for lr in lrs]
        for a, b in zip(together, alone, strict=True):
            if freeze:  # alone, on features computed once: the same numbers
                for key in ("settings", "loss_curve", "test_accuracy", "test_loss",
                            "train_accuracy", "confusion", "trainable_params"):
                    assert a[key] == b[key], (freeze, key)
            else:  # a stacked group
                assert (a["engine"], a["group_size"]) == ("stacked", 2)
                assert_same_finetuning(a, b)
        assert together[0]["loss_curve"] != together[1]["loss_curve"]
    with pytest.raises(FinetuneError, match="lrs"):
        finetune_model_lrs(model, data=task, lrs=[], **kw)
    copy = tmp_path / tiny_run.name
    shutil.copytree(tiny_run, copy)
    small = dict(task="genre", steps=2, batch_size=4, passage_bytes=64, test_max=8,
                 train_eval_max=4, standardize=8, device="cpu", freeze=True)
    first = finetune_lrs(copy, lrs=[1e-2, 1e-1], **small)
    assert [r["cached"] for r in first] == [False, False]
    one = finetune(copy, lr=1e-1, **small)
    assert one["cached"] is True and one["path"] == first[1]["path"]
    assert one["test_accuracy"] == first[1]["test_accuracy"]
    assert [r["cached"] for r in finetune_lrs(copy, lrs=[1e-1, 3e-2], **small)] == [True, False]
    got = finetune_many([(copy, small | {"lrs": [1e-2, 3e-2]}), (copy, small | {"lr": 1e-2})])
    assert [r["cached"] for r in got[0]] == [True, True] and got[1]["cached"] is True


def test_a_diverged_lr_ends_alone_and_the_next_lr_starts_clean(tiny_run):
    """A non-finite loss ends that lr's fine-tuning `diverged` before its update (the curve's
    last point holds the loss as text; the steps done leave it out), evaluated all the same; in
    a frozen lr grid the next lr trains its shared head from a clean start, as it does alone."""
    from normlab.finetune import finetune_model_lrs
    from normlab.train import load_trained_model

    _, model = load_trained_model(tiny_run)
    task = small_task("genre", n_train=64, n_test=32)
    kw = dict(steps=4, batch_size=8, warmup=1, device="cpu", seed=2, standardize=16,
              train_eval_max=16, log_every=2, freeze=True)
    huge, normal = finetune_model_lrs(model, data=task, lrs=[1e36, 1e-3], **kw)
    assert huge["outcome"] == "diverged" and huge["loss_curve"][-1][1] in ("nan", "inf")
    assert huge["steps_done"] == huge["loss_curve"][-1][0] - 1 < 4
    assert 0.0 <= huge["test_accuracy"] <= 1.0
    alone = finetune_model(model, data=task, lr=1e-3, **kw)
    assert normal["outcome"] == "completed" and normal["steps_done"] == 4
    for key in ("loss_curve", "test_loss", "test_accuracy", "confusion"):
        assert normal[key] == alone[key], key


def test_long_passages_are_read_in_windows_of_the_pretraining_context(tiny_run):
    """A 128-byte passage on a model pretrained on 64-byte sequences: two windows, each from
    position 0; the pooled vector is the mean over both windows' streams."""
    from normlab.finetune import SequenceClassifier
    from normlab.train import load_trained_model

    _, model = load_trained_model(tiny_run)
    clf = SequenceClassifier(model, 3, window=64).eval()
    idx = torch.randint(0, 256, (2, 128), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got = clf.features(idx)
        halves = [model.stream(idx[:, :64]), model.stream(idx[:, 64:])]
    assert torch.allclose(got, torch.cat(halves, 1).mean(1), atol=1e-6)
    with pytest.raises(FinetuneError, match="windows of 64"):
        clf.features(idx[:, :100])
    # finetune() picks the window from the run (data.seq_len 64) for 128-byte passages
    res = finetune(tiny_run, task="genre", steps=1, batch_size=2, passage_bytes=128, test_max=4,
                   train_eval_max=2, standardize=4, device="cpu", force=True)
    assert res["settings"]["window"] == 64


def test_standardized_features_have_zero_mean_and_unit_scale(tiny_run):
    from normlab.finetune import SequenceClassifier
    from normlab.train import load_trained_model

    _, model = load_trained_model(tiny_run)
    clf = SequenceClassifier(model, 3).eval()
    feats = torch.randn(64, model.cfg.d_model) * 0.05 + 6.0
    clf.standardize_from(feats)
    z = (feats - clf.feature_mean) / clf.feature_scale
    assert torch.allclose(z.mean(0), torch.zeros(z.shape[1]), atol=1e-4)
    assert torch.allclose(z.std(0), torch.ones(z.shape[1]), atol=1e-4)
    with pytest.raises(FinetuneError, match="standardize"):
        finetune(tiny_run, task="genre", standardize=1)


def test_validation_split_lies_between_train_and_test_in_every_play():
    task = genre_task("genre", passage_bytes=256, val_fraction=0.1)
    plain = genre_task("genre", passage_bytes=256)
    assert len(task.val_y) > 0 and len(plain.val_y) == 0
    assert len(task.train_y) < len(plain.train_y)
    assert np.array_equal(task.test_x, plain.test_x)  # the test set does not change
    for p_i, play in enumerate(task.plays):
        val_start, val_end = task.val_bounds[play]
        train_end, test_start, _ = task.bounds[play]
        assert val_end == train_end and test_start == val_end + task.gap
        tr = task.train_offset[task.train_play == p_i]
        va = task.val_offset[task.val_play == p_i]
        assert tr.max() + 256 + task.gap <= val_start <= va.min()
        assert va.max() + 256 <= val_end
    with pytest.raises(DataError, match="val_fraction"):
        genre_task("genre", val_fraction=0.9)


def test_finetune_from_weights_kept_along_the_run(tmp_path):
    """`step` fine-tunes the weights a run kept at that step, not its last checkpoint: its own
    result file, its step recorded, its accuracy that of those weights (the same as
    fine-tuning a model loaded from that step); a step the run did not keep is an error that
    names the kept ones."""
    from normlab.config import load_run_config
    from normlab.train import train_run
    from normlab.train.checkpoint import load_trained_model

    cfg = load_run_config(None, [
        "model.n_blocks=1", "model.d_model=32", "model.n_heads=2", "model.max_seq_len=64",
        "data.seq_len=64", "train.batch_size=8", "train.steps=20", "train.eval_every=10",
        "train.checkpoint_every=10", "train.keep_checkpoints=true", "train.eval_batches=2",
        "train.lr=3e-3", "train.device=cpu"])
    run = tmp_path / train_run(cfg, tmp_path, progress=False)["run_id"]
    kw = dict(steps=3, lr=1e-3, batch_size=8, warmup=1, passage_bytes=64, device="cpu",
              train_eval_max=32, test_max=64, val_max=32)
    last = finetune(run, task="genre", **kw)
    kept = finetune(run, task="genre", step=10, **kw)
    assert last["checkpoint_step"] == 20 and kept["checkpoint_step"] == 10
    assert kept["path"] != last["path"]
    _, at10 = load_trained_model(run, step=10)
    direct = finetune_model(at10, task="genre", **kw)
    assert kept["test_accuracy"] == direct["test_accuracy"]
    assert kept["loss_curve"] == direct["loss_curve"] != last["loss_curve"]
    assert finetune(run, task="genre", step=10, **kw)["cached"] is True
    with pytest.raises(CheckpointError, match="no weights kept at step 15"):
        finetune(run, task="genre", step=15, **kw)
