"""Bad input to any command: exit status 2, one message that names the field, option or path, no
traceback, nothing written. A fuzz set over every command and each family of bad input (config
files, overrides, numbers, paths, sizes that cannot fit, text that looks like Rich markup),
plus the config-level checks behind them."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from normlab.cli import app, load_commands
from normlab.config import (
    ConfigError,
    DataConfig,
    ModelConfig,
    TrainConfig,
    load_run_config,
    load_yaml,
)

SPEC = "name: s\nbase:\n  train: {steps: 2}\naxes:\n  train.lr: [1e-3, 2e-3]\n"


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    """A folder of bad inputs; the tests run with it as the working folder."""
    d = tmp_path_factory.mktemp("bad")
    (d / "bin.yaml").write_bytes(bytes(range(128, 256)) * 4)
    (d / "dir.yaml").mkdir()
    (d / "dup.yaml").write_text("train:\n  lr: 1e-3\n  steps: 5\n  lr: 2e-3\n")
    (d / "list.yaml").write_text("- 1\n- 2\n")
    (d / "modellist.yaml").write_text("model: [1, 2]\n")
    (d / "broken.yaml").write_text("model: {d_model: [32\n")
    (d / "afile").write_text("not a folder\n")
    (d / "a[").mkdir()  # the file a[/b].yaml: a path that reads as a Rich closing tag
    (d / "a[" / "b].yaml").write_bytes(b"\xff\xfe\x00")
    (d / "[red]x[").mkdir()  # [red]x[/red].yaml
    (d / "[red]x[" / "red].yaml").write_text("model: {bogus: 1}\n")
    (d / "spec.yaml").write_text(SPEC)
    (d / "log1.yaml").write_text(SPEC.replace("[1e-3, 2e-3]", "{log: [1e-3]}"))
    (d / "loginf.yaml").write_text(SPEC.replace("[1e-3, 2e-3]", "{log: [1e-3, .inf], num: 3}"))
    (d / "dupspec.yaml").write_text(SPEC + "axes:\n  train.warmup: [0]\n")
    (d / "basesec.yaml").write_text(SPEC.replace("train: {steps: 2}", "train: 5"))
    (d / "huge.yaml").write_text(SPEC.replace("steps: 2", "steps: 2, batch_size: 100000000"))
    (d / "prenorm.yaml").write_text("model:\n  placement: prenorm\n")
    (d / "nocolon.yaml").write_text("model:\n  d_model: 32\n  n_heads 2\n")
    (d / "tab.yaml").write_text("model:\n\td_model: 32\n")
    (d / "indent.yaml").write_text("model:\n  d_model: 32\n n_heads: 2\n")
    (d / "quote.yaml").write_text('train:\n  lr: 1e-3\n  name: "abc\n')
    (d / "colon.yaml").write_text("train:\n  name: a: b\n")
    (d / "modle.yaml").write_text("modle:\n  d_model: 32\n")
    (d / "axis.yaml").write_text(SPEC.replace("train.lr:", "train.lrr:"))
    (d / "bareaxis.yaml").write_text(SPEC.replace("train.lr:", "lr:"))
    (d / "runs").mkdir()
    return d


# (command line, text the message must contain). Every case must exit 2 with that text.
CASES = [
    # config files: binary, a folder, missing, duplicate key, not a mapping, broken, markup names
    ("train bin.yaml", "bin.yaml: not a text file"),
    ("train dir.yaml", "dir.yaml: is a folder"),
    ("train nope.yaml", "nope.yaml: not found"),
    ("train dup.yaml", "key 'lr' is given twice"),
    ("train list.yaml", "list.yaml: expected a mapping"),
    # YAML syntax: the line and column of the mistake (not where the parser gave up), in words
    ("train broken.yaml", "broken.yaml: not valid YAML: line 1, column 18: a list opened with "
                          "'[' here is not closed: add the ']'"),
    ("train nocolon.yaml", "nocolon.yaml: not valid YAML: line 3, column 3: a key without ':' "
                           "after it; write `key: value`"),
    ("train tab.yaml", "tab.yaml: not valid YAML: line 2, column 1: a tab character; YAML "
                       "indents with spaces only"),
    ("train indent.yaml", "indent.yaml: not valid YAML: line 3, column 2: this line is not "
                          "indented like the lines of its mapping above it"),
    ("train quote.yaml", "quote.yaml: not valid YAML: line 3, column 9: a quoted string opened "
                         "here is never closed"),
    ("train colon.yaml", "colon.yaml: not valid YAML: line 2, column 10: a ':' where a value "
                         "was expected"),
    ("sweep plan nocolon.yaml", "sweep spec nocolon.yaml: not valid YAML: line 3, column 3"),
    # an unknown section of a run config
    ("train modle.yaml", "modle: unknown field (did you mean 'model'?)"),
    ("train a[/b].yaml", "a[/b].yaml: not a text file"),
    ("train [red]x[/red].yaml", "model.bogus"),
    ("plan --config bin.yaml", "bin.yaml: not a text file"),
    ("plan --config dir.yaml", "dir.yaml: is a folder"),
    ("plan --config dup.yaml", "given twice"),
    ("plan --config modellist.yaml", "modellist.yaml: model: expected a mapping"),
    ("probe --config dir.yaml", "dir.yaml: is a folder"),
    ("sweep plan bin.yaml", "sweep spec bin.yaml: not a text file"),
    ("sweep plan dir.yaml", "sweep spec dir.yaml: is a folder"),
    ("sweep plan dupspec.yaml", "key 'axes' is given twice"),
    ("sweep run dir.yaml", "sweep spec dir.yaml: is a folder"),
    ("sweep plan basesec.yaml", "base.train: expected a mapping"),
    ("sweep plan log1.yaml", "log takes [low, high], got [0.001]"),
    ("sweep plan loginf.yaml", "axis train.lr: inf is not a finite number"),
    # overrides: non-finite floats, vocabulary, unknown fields, malformed
    ("train --set train.lr=inf", "train.lr: Input should be a finite number"),
    ("train --set model.init_std=.inf", "model.init_std: Input should be a finite number"),
    ("train --set model.placement=admin --set model.admin_omega=nan", "model.admin_omega"),
    ("plan --placement admin --set admin_omega=inf", "admin_omega"),
    ("train --set data.val_fraction=nan", "data.val_fraction"),
    ("train --set model.vocab_size=16", "model.vocab_size: 16 is smaller"),
    ("probe --set vocab_size=16", "vocab_size: 16 is smaller"),
    ("train --set model.nope=1", "model.nope: unknown field"),
    ("train --set justaword", "expected KEY=VALUE"),
    # sizes that cannot fit: refused with the estimate and the memory free
    ("train --set model.d_model=1e9", "available; lower model.d_model"),
    ("train --set train.batch_size=1e8", "available; lower model.d_model"),
    ("sweep plan huge.yaml", "sweep run 0"),
    # plan --time builds and times the model: refused at once, as train refuses it
    ("plan --time --set d_model=1000000 --set n_heads=1", "plan --time: needs at least"),
    ("probe --width 100000 --blocks 4000", "available; lower --width"),
    ("advise --blocks 4000 --width 100000 --heads 2", "available; lower --width"),
    # every option under its own name
    ("probe --perturb-draws 0", "--perturb-draws"),
    ("probe --update-steps -5", "--update-steps"),
    ("probe --update-lr nan", "--update-lr"),
    ("probe --perturb-eps -1", "--perturb-eps"),
    ("probe --perturb-eps inf", "--perturb-eps"),
    ("probe --drop-threshold nan", "--drop-threshold"),
    ("probe --seeds 0", "--seeds"),
    ("probe --batches 0", "--batches"),
    ("probe --seq-len 1", "--seq-len"),
    ("probe --blocks 0,4", "--blocks"),
    ("probe --blocks 99999", "--blocks"),
    ("probe --width 0", "--width"),
    ("advise --blocks 4 --width 32 --heads 0", "--heads"),
    ("advise --blocks 4 --width 32 --heads -2", "--heads"),
    ("advise --blocks 4 --width 32 --heads 3", "--heads 3 does not divide --width 32"),
    ("advise --blocks 4 --width 32 --check-steps 0", "--check-steps"),
    ("advise --blocks 4 --width 32 --warmup-budget -1", "--warmup-budget"),
    ("advise --blocks 0 --width 32", "--blocks"),
    ("advise --blocks 4 --width 32 --also olmo", "--also olmo: placement: got 'olmo' (did you "
                                                 "mean 'olmo2'?)"),
    ("plan --blocks 0", "--blocks"),
    ("train --nproc 0", "--nproc"),
    ("train --threads 0", "--threads"),
    ("prepare nope.txt --out out", "data source 'nope.txt' does not exist"),
    ("prepare shakespeare --out afile", "afile is a file, not a folder"),
    ("prepare shakespeare --out out --tokenizer bpe:9", "give N from 257"),
    ("prepare dir.yaml --out out", "dir.yaml contains no .txt, .jsonl or .parquet files"),
    ("finetune runs --lr nan", "--lr"),
    ("finetune runs --steps 0", "--steps"),
    ("finetune runs --passage-bytes 1", "--passage-bytes"),
    ("finetune runs --test-max 0", "--test-max"),
    ("probe-hf --hf minilm --batches 0", "--batches"),
    ("probe-hf --hf minilm --seq-len 1", "--seq-len"),
    ("sweep plan spec.yaml --workers 0", "--workers"),
    ("sweep plan spec.yaml --threads 0", "--threads"),
    ("sweep run spec.yaml --workers -1", "--workers"),
    ("sweep map runs --metric bogus", "metric: 'bogus'"),
    ("study --profile bogus", "bogus"),
    ("study --executor slurm", "--executor: 'slurm'"),
    ("study --address 127.0.0.1:6379", "--address 127.0.0.1:6379: only with --executor ray"),
    ("study --claims C6c", "C6C"),
    ("report runs --markdown", "--markdown"),
    # output locations that are files, under files, or folders where a file is written
    ("train --root afile", "--root afile: afile is a file"),
    ("train --root afile/x", "afile/x cannot be created"),
    ("train --resume afile", "afile"),
    ("sweep run spec.yaml --root afile", "--root afile: afile is a file"),
    ("study --out afile", "afile is a file"),
    ("probe --out afile", "afile is a file"),
    ("probe-hf --hf minilm --out afile", "afile is a file"),
    ("sweep map runs --out afile/map.png", "afile/map.png cannot be written"),
    ("sweep summarize runs --format csv --out dir.yaml", "dir.yaml is a folder"),
    ("report runs --out dir.yaml", "dir.yaml is a folder"),
    ("report nope", "nope"),
    ("runs afile", "afile"),
    ("sample nope", "nope: no such run folder"),
    ("sample runs", "runs: not a run folder"),
    ("sample afile --tokens 0", "--tokens"),
    # a near miss is named: "did you mean", for fields and for values
    ("train --set model.placment=pre",
     "model.placment: unknown field (did you mean 'model.placement'?)"),
    ("plan --set plcement=pre", "plcement: unknown field (did you mean 'placement'?)"),
    # a section's field given without its section, exactly or nearly
    ("train --set placement=prenorm", "placement: unknown field (did you mean 'model.placement'?)"),
    ("train --set warmpu=10", "warmpu: unknown field (did you mean 'train.warmup'?)"),
    # a bare model field, which plan takes, is named with its section in a run config
    ("train --set d_ff=256", "d_ff: unknown field (did you mean 'model.d_ff'?)"),
    # plan and probe take model fields only: a run's other settings are refused by name
    ("plan --set train.lr=1e-3", "--set train.lr: a train setting, which only a run has"),
    ("probe --set data.seq_len=8", "--set data.seq_len: a data setting, which only a run has"),
    ("train prenorm.yaml", "got 'prenorm' (did you mean 'pre'?)"),
    ("sweep plan axis.yaml", "unknown config path 'train.lrr' (did you mean 'train.lr'?)"),
    ("sweep plan bareaxis.yaml", "unknown config path 'lr' (did you mean 'train.lr'?)"),
    ("probe --placement prenorm", "'prenorm' is not a placement (did you mean 'pre'?)"),
    ("probe --placements pre,postt", "'postt' is not a placement (did you mean 'post'?)"),
    ("probe --probes stram", "(did you mean 'stream'?)"),
    ("study --profile quik", "'quik' is not one of tiny, quick, standard, long, gpu, full (did you "
                             "mean 'quick'?)"),
    ("sweep map runs --metric val_los", "(did you mean 'val_loss'?)"),
    ("train --set train.schedule=cos", "got 'cos' (did you mean 'cosine'?)"),
    ("plan --norm rms", "got 'rms' (did you mean 'rmsnorm'?)"),
    ("probe-hf --hf minlm", "not a known checkpoint (minilm, smollm2) and no such file or "
                            "folder (did you mean 'minilm'?)"),
]


def _invoke(args: list[str]):
    return CliRunner().invoke(app, args, terminal_width=200)


@pytest.mark.parametrize("line,needle", CASES, ids=[c[0] for c in CASES])
def test_bad_input_exits_2_with_a_message_naming_it(files, monkeypatch, line, needle):
    monkeypatch.chdir(files)
    before = sorted(p.name for p in files.rglob("*"))
    r = _invoke(line.split())
    assert r.exit_code == 2, (r.exit_code, r.output, r.exception)
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    assert "Traceback" not in r.output
    assert needle in " ".join(r.output.split()), r.output
    assert sorted(p.name for p in files.rglob("*")) == before  # nothing written


def _paths(cmd, path=()):
    yield path
    for name, sub in getattr(cmd, "commands", {}).items():
        yield from _paths(sub, (*path, name))


def test_the_fuzz_set_covers_every_command():
    commands = {" ".join(p) for p in _paths(load_commands())
                if p and not hasattr(_command(p), "commands")}
    covered = {" ".join(line.split()[:2]) if line.startswith("sweep") else line.split()[0]
               for line, _ in CASES}
    assert commands <= covered, commands - covered


def _command(path):
    cmd = load_commands()
    for name in path:
        cmd = cmd.commands[name]
    return cmd


def test_a_read_only_output_folder_is_named(files, monkeypatch):
    monkeypatch.chdir(files)
    (files / "ro").mkdir(exist_ok=True)
    real = os.access  # (root may write anywhere: a read-only folder is simulated)
    monkeypatch.setattr(os, "access", lambda p, mode: real(p, mode) and not (
        Path(p).name == "ro" and mode & os.W_OK))
    for line in ("train --root ro", "train --root ro/runs", "study --out ro/s",
                 "sweep run spec.yaml --root ro"):
        r = _invoke(line.split())
        assert r.exit_code == 2, r.output
        assert "ro is not writable" in " ".join(r.output.split()), r.output
    assert list((files / "ro").iterdir()) == []


# --- the config-level checks ---------------------------------------------------------------

FLOAT_FIELDS = [(section, name) for section, cls in (("model", ModelConfig), ("data", DataConfig),
                                                     ("train", TrainConfig))
                for name, field in cls.model_fields.items() if "float" in str(field.annotation)]


@pytest.mark.parametrize("sets", [
    ["d_ff=256", "norm=rmsnorm"], ["model.d_ff=256", "model.norm=rmsnorm"],
    ["d_ff=256", "model.norm=rmsnorm"], ["model.d_ff=256", "norm=rmsnorm"]])
def test_plan_takes_a_model_field_bare_or_dotted_alike(sets):
    """`normlab plan --set` takes `d_ff=256` and `model.d_ff=256` (the form `train --set` needs)
    alike, mixed in one command too: none is dropped."""
    r = _invoke(["plan", *(f"--set={s}" for s in sets)])
    assert r.exit_code == 0, r.output
    assert "MLP: gelu, width 256" in r.output and "Attn(RMS(x))" in r.output


def test_a_later_set_of_one_field_wins_whichever_its_form():
    from normlab.config import load_model_config

    assert load_model_config(None, ["d_ff=64", "model.d_ff=128"]).d_ff == 128
    assert load_model_config(None, ["model.d_ff=128", "d_ff=64"]).d_ff == 64


def test_the_float_fields_are_found():
    assert {("train", "lr"), ("model", "init_std"), ("model", "admin_omega"),
            ("model", "mix_switch"), ("data", "val_fraction")} <= set(FLOAT_FIELDS)


@pytest.mark.parametrize("section,name", FLOAT_FIELDS, ids=[f"{s}.{n}" for s, n in FLOAT_FIELDS])
@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_every_float_field_rejects_non_finite_values_by_name(section, name, value):
    with pytest.raises(ConfigError, match=rf"{section}\.{name}: .*finite"):
        load_run_config(None, [f"{section}.{name}={value}"])


def test_duplicate_keys_are_rejected_at_any_depth_but_merge_keys_may_be_overridden():
    with pytest.raises(ConfigError, match=r"key 'model' is given twice .*lines 1 and 2"):
        load_yaml("model: {}\nmodel: {}\n")
    with pytest.raises(ConfigError, match=r"key 'lr' is given twice"):
        load_yaml("train:\n  sched:\n    lr: 1\n    lr: 2\n")
    assert load_yaml("a: &a {x: 1, y: 2}\nb:\n  <<: *a\n  x: 3\n")["b"] == {"x": 3, "y": 2}


def test_vocab_below_the_byte_tokenizer_is_rejected_and_256_accepted():
    with pytest.raises(ConfigError, match=r"model\.vocab_size: 255 is smaller .* 256"):
        load_run_config(None, ["model.vocab_size=255"])
    assert load_run_config(None, ["model.vocab_size=256"]).model.vocab_size == 256


@pytest.mark.parametrize("overrides", [
    ["model.mlp=gelu"], ["model.mlp=swiglu", "model.positions=rope"],
    ["model.placement=post", "model.norm=rmsnorm"], ["model.kind=encoder"],
    ["train.activation_checkpointing=true"],
])
def test_the_memory_estimate_is_a_lower_bound_of_what_autograd_keeps(overrides):
    """The estimate never refuses a run that fits: its activations are at most the bytes of
    the tensors saved for the backward pass (parameters aside)."""
    from normlab.nn import build_model
    from normlab.train.memory import estimate, param_count

    cfg = load_run_config(None, ["model.n_blocks=2", "model.d_model=64", "model.n_heads=2",
                                 "model.max_seq_len=32", "data.seq_len=32", *overrides])
    model = build_model(cfg.model, seed=0)
    assert param_count(cfg.model) <= sum(p.numel() for p in model.parameters())
    batch, seq = 4, 32
    x = torch.randint(0, 256, (batch, seq))
    y = torch.randint(0, 256, (batch, seq)) if cfg.model.kind == "decoder" else torch.zeros(
        batch, dtype=torch.long)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in params:
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x, y)
    est = estimate(cfg.model, batch, seq,
                   activation_checkpointing=cfg.train.activation_checkpointing)
    assert 0 < est.activation_bytes <= sum(saved.values())
    if not cfg.train.activation_checkpointing:
        assert est.activation_bytes >= 0.5 * sum(saved.values())  # and not a useless bound


def test_a_run_that_fits_is_not_refused():
    from normlab.train.memory import check_run_fits

    check_run_fits(load_run_config(None, []))  # the default run: a few hundred MiB


def test_a_file_where_the_run_folder_goes_is_named(files, monkeypatch):
    from normlab.config import load_run_config

    monkeypatch.chdir(files)
    sets = ["--set=train.steps=1", "--set=model.n_blocks=1", "--set=model.d_model=16"]
    run_id = load_run_config(None, [s.removeprefix("--set=") for s in sets]).run_id()
    (files / "runs" / run_id).write_text("in the way\n")
    try:
        r = _invoke(["train", *sets, "--root=runs", "--quiet"])
    finally:
        (files / "runs" / run_id).unlink()
    assert r.exit_code == 2, (r.output, r.exception)
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    assert f"runs/{run_id}: is a file" in " ".join(r.output.split())


def test_report_of_a_file_says_it_needs_a_folder(files, monkeypatch):
    monkeypatch.chdir(files)
    r = _invoke(["report", "afile"])
    assert r.exit_code == 2, r.output
    assert "afile: is a file; give a folder" in " ".join(r.output.split())
    assert not (files / "report.html").exists() and not (files / "afile.html").exists()


def test_two_checkpoints_are_refused_not_half_probed(files, monkeypatch):
    monkeypatch.chdir(files)
    r = _invoke(["probe", "--checkpoint", "runs", "--checkpoint", "afile"])
    assert r.exit_code == 2, r.output
    assert "--checkpoint is given 2 times" in " ".join(r.output.split())
