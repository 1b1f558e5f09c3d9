"""`FinetuneConfig` (normlab.finetune.config): its validation, the record and cache hash that
name the result files written before it existed, the numbers fine-tuning gave before it, and
the settings table of docs/finetune.md (written from the fields' descriptions).

    python tests/finetune/test_finetune_config.py   # rewrite the table in docs/finetune.md
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from normlab.finetune import (
    FinetuneConfig,
    FinetuneError,
    finetune_model,
    finetune_model_lrs,
    finetune_path,
)
from normlab.finetune.config import finetune_config

DOC = Path(__file__).resolve().parents[2] / "docs" / "finetune.md"
BEGIN, END = "<!-- finetune-config -->", "<!-- /finetune-config -->"

# What `finetune_settings("genre")` returned (and result files store) before FinetuneConfig.
LEGACY_DEFAULTS = {
    "task": "genre", "steps": 200, "lr": 3e-4, "batch_size": 32, "warmup": 20, "seed": 0,
    "pooling": "mean", "freeze": False, "passage_bytes": 256, "gap": 1024,
    "weight_decay": 0.01, "min_lr_ratio": 0.0, "grad_clip": 1.0, "train_eval_max": 2048,
    "test_max": None, "window": None, "val_fraction": 0.0, "val_max": None, "standardize": 512,
    "optimizer": "adamw(0.9,0.999,1e-8)", "schedule": "cosine", "version": 2}
# The names `finetune_path` gave these settings before FinetuneConfig (files of studies on disk).
C10_LIKE = dict(task="play", steps=80, lr=1e-3, batch_size=16, warmup=8, passage_bytes=256,
                window=64, test_max=768, val_fraction=0.1, val_max=512, train_eval_max=256,
                freeze=True, grad_clip=None)
LEGACY_NAMES = [("pre-L2-d32-abcdef012345", {}, True, None, "genre-init-b1cb5ee187f5.json"),
                ("pre-L2-d32-abcdef012345", {}, False, 20, "genre-36744155963d.json"),
                ("run", C10_LIKE, False, 7, "play-eb0227d8462a.json")]

# A tiny fine-tune recorded before FinetuneConfig (torch 2.13.0, CPU, one thread): a model at
# init (1 block, width 16), seed 1, 3 steps of 4 passages of 64 bytes.
TINY = dict(steps=3, batch_size=4, warmup=1, passage_bytes=64, test_max=16, train_eval_max=8,
            standardize=8, seed=1)
BEFORE_FULL = {"loss_curve": [[1, 1.1419892311096191, 0.001], [2, 1.2270712852478027, 0.0005],
                              [3, 1.4266371726989746, 0.0]],
               "test_loss": 1.1973628997802734, "test_accuracy": 0.25}
BEFORE_PROBE = [  # frozen, last position, lrs 1e-2 and 1e-1 together, with validation passages
    {"loss_curve": [[1, 1.1291289329528809, 0.01], [2, 1.0143886804580688, 0.005],
                    [3, 1.0269252061843872, 0.0]],
     "test_loss": 1.0792927742004395, "val_loss": 1.0446274280548096, "test_accuracy": 0.5},
    {"loss_curve": [[1, 1.1291289329528809, 0.1], [2, 0.6522936224937439, 0.05],
                    [3, 1.0667437314987183, 0.0]],
     "test_loss": 1.2048615217208862, "val_loss": 0.8301426768302917, "test_accuracy": 0.3125}]


# -- validation ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("settings", "named"), [
    ({"lr": 0.0}, "lr: Input should be greater than 0"),
    ({"lr": float("nan")}, "lr:"),
    ({"steps": 0}, "steps: Input should be greater than or equal to 1"),
    ({"steps": True}, "steps: an integer, got True"),
    ({"steps": 2.5}, "steps:"),
    ({"task": "author"}, "task: Input should be 'genre' or 'play', got 'author'"),
    ({"pooling": "max"}, "pooling:"),
    ({"beta2": 1.0}, "beta2: Input should be less than 1"),
    ({"eps": 0.0}, "eps: Input should be greater than 0"),
    ({"min_lr_ratio": 1.5}, "min_lr_ratio: Input should be less than or equal to 1"),
    ({"val_fraction": 0.5}, "val_fraction: Input should be less than 0.5"),
    ({"grad_clip": 0.0}, "grad_clip:"),
    ({"test_max": 0}, "test_max:"),
    ({"window": 48}, "window: must divide passage_bytes=256, got 48"),
    ({"standardize": 1}, "standardize: 0 (off) or at least 2 passages, got 1"),
    ({"step": 3}, "step: unknown field (did you mean 'steps'?)"),
])
def test_a_bad_setting_is_refused_naming_its_field(settings, named):
    with pytest.raises(FinetuneError, match="invalid FinetuneConfig") as e:
        FinetuneConfig.parse(settings)
    assert named in str(e.value)
    with pytest.raises(FinetuneError) as e:  # the calls' keywords are validated alike
        finetune_config(**settings)
    assert named in str(e.value)


def test_every_bad_field_is_named_at_once_and_the_config_is_frozen():
    with pytest.raises(FinetuneError) as e:
        FinetuneConfig.parse({"lr": -1, "batch_size": 0, "beta1": 2})
    assert [line.split(":")[0].strip() for line in str(e.value).splitlines()[1:]] == [
        "lr", "batch_size", "beta1"]
    cfg = FinetuneConfig()
    with pytest.raises(ValueError):
        cfg.lr = 1.0  # type: ignore[misc]
    assert cfg.replace(lr=1e-3).lr == 1e-3 and cfg.lr == 3e-4
    with pytest.raises(FinetuneError, match="lr:"):  # a copy is validated
        cfg.replace(lr=-1.0)


def test_a_call_takes_a_config_or_its_fields_never_both():
    cfg = FinetuneConfig(steps=5)
    assert finetune_config(cfg) is cfg and finetune_config(steps=5) == cfg
    with pytest.raises(FinetuneError, match=r"give a config or settings \(lr\), not both"):
        finetune_config(cfg, lr=1e-3)
    with pytest.raises(FinetuneError, match="a task's name goes in task="):
        finetune_config("genre")  # type: ignore[arg-type]


def test_a_config_file_is_read_and_its_errors_name_the_field(tmp_path):
    from normlab.config import ConfigError

    path = tmp_path / "ft.yaml"
    path.write_text("steps: 50\nbeta2: 0.98\nfreeze: true\n")
    assert FinetuneConfig.load(path) == FinetuneConfig(steps=50, beta2=0.98, freeze=True)
    path.write_text("steps: 50\nlr: -1\n")
    with pytest.raises(FinetuneError, match="lr: Input should be greater than 0"):
        FinetuneConfig.load(path)
    with pytest.raises(ConfigError, match="nope.yaml: not found"):
        FinetuneConfig.load(tmp_path / "nope.yaml")


# -- the record and the cache hash ---------------------------------------------------------------

def test_the_record_of_the_old_settings_is_what_result_files_hold():
    assert FinetuneConfig().record() == LEGACY_DEFAULTS
    assert FinetuneConfig(**C10_LIKE).record() == LEGACY_DEFAULTS | C10_LIKE
    # ints given for floats are recorded as the floats they always were (the hash reads JSON)
    assert repr(FinetuneConfig(lr=1, weight_decay=0).record()["lr"]) == "1.0"


@pytest.mark.parametrize(("run_id", "settings", "from_init", "step", "name"), LEGACY_NAMES)
def test_the_cache_hash_names_the_files_written_before_the_config(tmp_path, run_id, settings,
                                                                  from_init, step, name):
    cfg = FinetuneConfig(**settings)
    assert finetune_path(tmp_path / run_id, cfg, from_init, step).name == name
    assert name.endswith(f"-{cfg.cache_hash(run_id, from_init, step)}.json")


def test_the_hash_covers_every_setting_and_the_weights_but_not_defaults_added_later():
    base = FinetuneConfig()
    key = base.cache_hash("run", False, 20)
    assert key == FinetuneConfig().cache_hash("run", False, 20)  # stable
    assert len({key, base.cache_hash("other", False, 20), base.cache_hash("run", True, None),
                base.cache_hash("run", False, 10)}) == 4
    changed = {"task": "play", "steps": 201, "lr": 1e-3, "batch_size": 31, "warmup": 2,
               "seed": 1, "pooling": "last", "freeze": True, "passage_bytes": 128, "gap": 0,
               "weight_decay": 0.0, "min_lr_ratio": 0.1, "grad_clip": None, "beta1": 0.8,
               "beta2": 0.98, "eps": 1e-6, "train_eval_max": 1, "test_max": 5, "window": 64,
               "val_fraction": 0.1, "val_max": 3, "standardize": 0, "eval_batch_size": 64,
               "log_every": 1}
    assert set(changed) == set(FinetuneConfig.model_fields)  # every field is covered here
    for field, value in changed.items():
        assert base.replace(**{field: value}).cache_hash("run", False, 20) != key, field
    # fields added later: recorded only when set away from their default
    assert "log_every" not in base.record() and "eval_batch_size" not in base.record()
    assert base.replace(log_every=5).record()["log_every"] == 5
    assert base.replace(beta2=0.95, eps=1e-10).record()["optimizer"] == "adamw(0.9,0.95,1e-10)"


# -- the optimizer and the numbers --------------------------------------------------------------

def test_the_optimizer_gets_the_config_s_settings_through_the_train_config():
    from torch import nn

    from normlab.train.optim import adamw

    model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
    group = adamw(model, FinetuneConfig().train_config()).param_groups[0]
    assert (group["betas"], group["eps"], group["weight_decay"], group["lr"]) == (
        (0.9, 0.999), 1e-8, 0.01, 3e-4)
    tc = FinetuneConfig(beta1=0.8, beta2=0.95, eps=1e-6, weight_decay=0.1, lr=1e-2,
                        min_lr_ratio=0.1, grad_clip=None, steps=100).train_config()
    group = adamw(model, tc).param_groups[0]
    assert (group["betas"], group["eps"], group["weight_decay"], group["lr"]) == (
        (0.8, 0.95), 1e-6, 0.1, 1e-2)
    assert (tc.schedule, tc.min_lr_ratio, tc.grad_clip, tc.log_every) == ("cosine", 0.1, None, 2)


def _tiny_model():
    from normlab.config import make_model_config
    from normlab.nn import build_model

    return build_model(make_model_config(n_blocks=1, d_model=16, n_heads=2, max_seq_len=64),
                       seed=0)


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.skipif(not torch.__version__.startswith("2.13.0"),
                    reason="the numbers were recorded with torch 2.13.0")
def test_fine_tuning_by_config_gives_the_numbers_it_gave_before(one_thread):
    model = _tiny_model()
    full = finetune_model(model, FinetuneConfig(lr=1e-3, **TINY), device="cpu")
    assert {k: full[k] for k in BEFORE_FULL} == BEFORE_FULL
    assert full["settings"] == LEGACY_DEFAULTS | TINY | {"lr": 1e-3}
    probe = finetune_model_lrs(
        model, FinetuneConfig(freeze=True, pooling="last", val_fraction=0.1, val_max=8, **TINY),
        lrs=[1e-2, 1e-1], device="cpu")
    assert [{k: r[k] for k in BEFORE_PROBE[0]} for r in probe] == BEFORE_PROBE
    # a changed beta changes the numbers: the setting reaches the optimizer
    other = finetune_model(model, FinetuneConfig(lr=1e-3, beta2=0.9, **TINY), device="cpu")
    assert other["loss_curve"][:1] == full["loss_curve"][:1] != other["loss_curve"]


# -- the settings table of docs/finetune.md ------------------------------------------------------

def render(page: str) -> str:
    """`page` with the table of `FinetuneConfig`'s fields (scripts/config_docs.py's format)
    between its markers."""
    import config_docs

    head, rest = page.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    table = config_docs.section_doc("FinetuneConfig", FinetuneConfig, set())[4:]
    return "\n".join([head + BEGIN, *table, END]) + tail


def test_the_doc_table_is_the_fields_descriptions():
    page = DOC.read_text(encoding="utf-8")
    assert page == render(page), (
        "docs/finetune.md is out of date: run python tests/finetune/test_finetune_config.py")
    rows = page.split(BEGIN, 1)[1].split(END, 1)[0]
    for name, field in FinetuneConfig.model_fields.items():
        assert f"| `{name}` |" in rows and field.description in rows.replace("\\|", "|")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    import doc_writer

    sys.exit(doc_writer.main(sys.argv[1:], prog="python tests/finetune/test_finetune_config.py",
                             description="write docs/finetune.md's table of settings",
                             default=DOC, render=render))
