"""Training diagnostics: the token-varying share of the final stream and the `stalled` outcome."""

import contextlib
import hashlib
import json
import math
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import save_file

from normlab.config import ModelConfig, load_run_config
from normlab.data import TokenArray, Work, load_text_data
from normlab.nn import build_model
from normlab.study.experiments import _finished
from normlab.sweep.maps import aggregate, stability_map
from normlab.sweep.state import is_finished
from normlab.sweep.summarize import SweepTable, collect
from normlab.train import read_summary, train_run
from normlab.train.diagnostics import TokenShare, stalled
from normlab.train.group import train_group
from normlab.train.logging import read_metrics, write_json_atomic
from normlab.train.trainer import evaluate

# 95 printable characters in a cycle: each byte fixes the next, so a tiny model beats the
# unigram entropy (ln 95 = 4.55 nats) within 20 steps, while at lr 1e-6 it stays far above it.
CHARS = "".join(chr(c) for c in range(32, 127))
TINY = ["model.n_blocks=2", "model.d_model=32", "model.n_heads=2", "model.max_seq_len=32",
        "data.seq_len=32", "train.batch_size=8", "train.eval_batches=2", "train.log_every=1",
        "train.steps=20", "train.eval_every=10", "train.device=cpu"]
TRAINS = ["train.lr=1e-2"]
STALLS = ["train.lr=1e-6"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("cycle")
    for i in range(4):
        (folder / f"w{i}.txt").write_text((CHARS[i * 7:] + CHARS[:i * 7]) * 40)
    return folder


def cfg(corpus: Path, *extra: str):
    return load_run_config(None, [*TINY, f"data.source={corpus}", *extra])


# -- the unigram entropy ---------------------------------------------------------------------------
def test_unigram_entropy_of_known_bytes():
    tokens = TokenArray.from_works([Work("a", b"aabbbbcc")])
    expected = -(0.25 * math.log(0.25) * 2 + 0.5 * math.log(0.5))
    assert tokens.unigram_entropy == pytest.approx(expected, rel=1e-12)


# -- the token-varying share -----------------------------------------------------------------------
def reference_share(h: torch.Tensor) -> float:
    """The definition, in float64 on all tokens at once."""
    h = h.double().reshape(-1, h.shape[-1])
    mean = h.mean(0)
    var = (h - mean).square().sum(1).mean()
    return (var / (var + mean.square().sum())).item()


def test_token_share_of_a_constant_stream_is_zero():
    share = TokenShare()
    for _ in range(3):
        share.add(torch.full((1, 4, 8, 16), 0.7))
    (value,) = share.values()
    assert 0.0 <= value < 1e-12  # float32 rounding of the batch means only


def test_token_share_matches_its_definition_across_batches_even_when_tiny():
    gen = torch.Generator().manual_seed(0)
    offset = torch.randn(32, generator=gen) * 10
    for noise, lo, hi in ((1.0, 0.005, 0.02), (1e-3, 1e-9, 1e-7)):
        chunks = [offset + noise * torch.randn(1, b, 8, 32, generator=gen) for b in (3, 5, 1)]
        share = TokenShare()
        for c in chunks:
            share.add(c)
        expected = reference_share(torch.cat(chunks, dim=1))
        assert lo < expected < hi
        assert share.values()[0] == pytest.approx(expected, rel=1e-6)


def test_token_share_keeps_members_apart():
    gen = torch.Generator().manual_seed(1)
    stream = torch.stack([torch.ones(4, 8, 16), torch.randn(4, 8, 16, generator=gen)])
    share = TokenShare()
    share.add(stream)
    constant, random = share.values()
    assert constant < 1e-12
    assert random == pytest.approx(reference_share(stream[1]), rel=1e-6) and random > 0.95


def test_evaluate_reports_the_share_of_what_the_head_reads():
    model = build_model(ModelConfig(placement="pre", n_blocks=2, d_model=32, n_heads=2,
                                    max_seq_len=16), seed=0)
    gen = torch.Generator().manual_seed(0)
    batches = [(torch.randint(0, 256, (4, 16), generator=gen),) * 2 for _ in range(2)]
    fresh = evaluate(model, batches, contextlib.nullcontext())
    assert fresh["token_share"] > 0.9  # random tokens, random embeddings: nearly all varying
    assert math.isfinite(fresh["val_loss"])
    with torch.no_grad():  # the final norm now maps every token to its bias
        model.final.norm.weight.zero_()
        model.final.norm.bias.copy_(torch.linspace(-1, 1, 32))
    collapsed = evaluate(model, batches, contextlib.nullcontext())
    assert collapsed["token_share"] < 1e-12
    assert collapsed["val_loss"] != fresh["val_loss"]


# -- the stalled outcome ---------------------------------------------------------------------------
def test_stalled_rule():
    assert stalled(3.30, 3.33, 0.1) and stalled(5.5, 3.33, 0.1) and stalled(None, 3.33, 0.1)
    assert stalled(float("nan"), 3.33, 0.1)
    assert not stalled(3.2, 3.33, 0.1) and not stalled(3.30, 3.33, 0.0)


def test_a_run_that_trains_completes_and_one_that_does_not_stalls(tmp_path, corpus):
    entropy = load_text_data(str(corpus)).train.unigram_entropy
    assert entropy == pytest.approx(math.log(95), abs=0.01)
    trained = train_run(cfg(corpus, *TRAINS), tmp_path, progress=False)
    flat = train_run(cfg(corpus, *STALLS), tmp_path, progress=False)
    assert trained["outcome"] == "completed" and trained["val_loss"] < entropy - 0.1
    assert flat["outcome"] == "stalled" and flat["val_loss"] > entropy - 0.1
    assert flat["step"] == 20 and flat["reason"] is None
    for s in (trained, flat):
        assert s["unigram_entropy"] == entropy and s["stall_margin"] == 0.1
        evals = [r for r in read_metrics(tmp_path / s["run_id"] / "metrics.jsonl")
                 if "val_loss" in r]
        assert [r["step"] for r in evals] == [10, 20]
        assert all(0.0 <= r["token_share"] <= 1.0 for r in evals)
        assert s["token_share"] == evals[-1]["token_share"]
    # a stalled run is a result: not trained again, and finished for sweeps and the study
    assert train_run(cfg(corpus, *STALLS), tmp_path, progress=False) == flat
    assert is_finished(tmp_path / flat["run_id"]) and _finished(tmp_path / flat["run_id"])


def test_token_share_reaches_tensorboard(tmp_path, corpus):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    s = train_run(cfg(corpus, *STALLS, "train.steps=4", "train.eval_every=2"), tmp_path,
                  progress=False)
    events = EventAccumulator(str(tmp_path / s["run_id"] / "tb"))
    events.Reload()
    assert [e.step for e in events.Scalars("token_share")] == [2, 4]


def test_the_margin_decides_and_names_its_own_run(tmp_path, corpus):
    default, wide = cfg(corpus, *TRAINS), cfg(corpus, *TRAINS, "train.stall_margin=4.0")
    assert wide.run_id() != default.run_id()
    s = train_run(wide, tmp_path, progress=False)
    assert s["outcome"] == "stalled" and s["stall_margin"] == 4.0
    assert s["val_loss"] < s["unigram_entropy"] - 0.1  # it trained, but not by 4 nats


def test_the_default_margin_keeps_run_ids_recorded_before_it(tmp_path, corpus):
    """A run recorded before `stall_margin` existed: its id hashed the config without the field
    (and without the execution options and the labels added later, name and tags), its
    config.yaml has no such key. The same config names the same folder today, and the run is
    reported, not trained again."""
    c = cfg(corpus, *STALLS)
    old = c.to_dict()
    for key in ("stall_margin", "compile", "activation_checkpointing", "name", "tags",
                "keep_checkpoints", "deterministic", "extends", "decay_frac", "prores_steps",
                "optimizer"):
        del old["train"][key]
    for key in ("attention", "embedding", "placement_def", "qk_norm", "depth_param",
                "depth_base", "depth_alpha"):  # model fields added later still
        del old["model"][key]
    for key in ("task", "khop_alphabet", "khop_min_hops", "khop_max_hops", "tokenizer",
                "text_field", "khop_unanswered"):  # data fields too
        del old["data"][key]
    digest = hashlib.sha256(json.dumps(old, sort_keys=True).encode()).hexdigest()[:12]
    old_id = f"pre-L2-d32-{digest}"
    assert c.run_id() == old_id
    run_dir = tmp_path / old_id
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(yaml.safe_dump(old))
    summary = {"run_id": old_id, "outcome": "completed", "step": 20, "val_loss": 3.0}
    write_json_atomic(run_dir / "summary.json", summary)
    (run_dir / "checkpoint").mkdir()  # the result it reports is whole: its weights of step 20
    save_file({"w": torch.zeros(2)}, run_dir / "checkpoint" / "model.safetensors")
    write_json_atomic(run_dir / "checkpoint" / "trainer_state.json", {"step": 20})
    assert train_run(c, tmp_path, progress=False) == summary


def test_a_run_resumed_at_its_end_is_classified_from_its_last_evaluation(tmp_path, corpus):
    """Stopped after its last checkpoint, before its summary: the resumed run has nothing to
    train, and takes its final loss and share from metrics.jsonl."""
    first = train_run(cfg(corpus, *TRAINS), tmp_path, progress=False)
    run_dir = tmp_path / first["run_id"]
    write_json_atomic(run_dir / "summary.json", {"run_id": first["run_id"], "outcome": "running"})
    again = train_run(cfg(corpus, *TRAINS), tmp_path, progress=False)
    assert again["outcome"] == "completed" == first["outcome"]
    for key in ("val_loss", "token_share", "train_loss"):
        assert again[key] == first[key], key


def test_a_stacked_member_stalls_as_the_single_trainer_does(tmp_path, corpus):
    configs = [cfg(corpus, *TRAINS), cfg(corpus, *STALLS)]
    group = train_group(configs, tmp_path / "group")
    for c in configs:
        alone = train_run(c, tmp_path / "alone", progress=False)
        member = group[c.run_id()]
        assert member["engine"] == "stacked"
        assert member["outcome"] == alone["outcome"]
        assert member["val_loss"] == pytest.approx(alone["val_loss"], rel=1e-4)
        assert member["token_share"] == pytest.approx(alone["token_share"], rel=1e-3)
        assert member["unigram_entropy"] == alone["unigram_entropy"]
    assert [group[c.run_id()]["outcome"] for c in configs] == ["completed", "stalled"]


# -- consumers of outcomes -------------------------------------------------------------------------
def _table(outcomes: list[str]) -> SweepTable:
    rows, configs = [], []
    for i, outcome in enumerate(outcomes):
        rows.append({"run_id": f"r{i}", "outcome": outcome, "reason": None, "step": 20,
                     "val_loss": 3.0 + 0.1 * i})
        configs.append({"train.lr": 1e-3 if i < 2 else 3e-3, "train.warmup": 0,
                        "train.seed": i})
    return SweepTable(root=Path("."), name="t", axes=["train.lr"], rows=rows, configs=configs)


def test_maps_show_a_stalled_cell_as_stalled_not_as_a_loss(tmp_path):
    table = _table(["completed", "stalled", "stalled"])
    cells = aggregate(table, "train.warmup", "train.lr", None)
    mixed, flat = cells[(None, 1e-3, 0)], cells[(None, 3e-3, 0)]
    assert mixed.category == flat.category == "stalled"
    assert mixed.text() == "3.000\n1/2 stalled"  # the loss of the completed run only
    assert flat.text() == "stalled" and flat.mean_loss is None
    info = stability_map(table, tmp_path / "map.png", x="train.warmup", y="train.lr",
                         panel=None)
    assert info.path.stat().st_size > 0


def test_sweep_table_reports_stalled_runs(tmp_path, corpus):
    for extra in (TRAINS, STALLS):
        train_run(cfg(corpus, *extra), tmp_path, progress=False)
    table = collect(tmp_path)
    by_outcome = {r["outcome"]: r for r in table.rows}
    assert set(by_outcome) == {"completed", "stalled"}
    for outcome, row in by_outcome.items():
        s = read_summary(tmp_path / row["run_id"])
        assert s["outcome"] == outcome
        assert row["val_loss"] == s["val_loss"] and row["token_share"] == s["token_share"]
