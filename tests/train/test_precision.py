"""The precision a run trains in (`normlab.train.precision`): `auto` is decided once when a run
starts (bf16 where it is measured faster, never where the CPU emulates it), recorded in the run's
config.yaml and summary and kept on resume; bf16 on a CPU that emulates it warns before the first
step, with the measured ratio and the advice; `normlab plan --time` says the same before timing."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from typer.testing import CliRunner

import normlab.train.group as group
import normlab.train.machine as machine
import normlab.train.precision as precision
import normlab.train.trainer as trainer
from normlab.cli import app
from normlab.config import RunConfig, load_run_config
from normlab.train import perf, train_run
from normlab.train.group import train_group
from normlab.train.logging import read_metrics

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CPU = torch.device("cpu")
AVX2_ONLY = frozenset({"sse4_2", "avx", "avx2", "fma", "avx512f"})
WITH_BF16 = {"avx512_bf16": AVX2_ONLY | {"avx512_bf16"}, "amx_bf16": AVX2_ONLY | {"amx_bf16"}}
TINY = {"model": {"n_blocks": 1, "d_model": 32, "n_heads": 2, "max_seq_len": 32},
        "data": {"seq_len": 32},
        "train": {"steps": 4, "batch_size": 4, "log_every": 1, "eval_every": 0,
                  "eval_batches": 1, "device": "cpu"}}


def _cfg(*sets: str) -> RunConfig:
    return load_run_config(None, [f"{section}.{k}={v}" for section, fields in TINY.items()
                                  for k, v in fields.items()] + list(sets))


@pytest.fixture
def cpu(monkeypatch):
    """`cpu.set(flags, ratio)`: the CPU flags normlab sees and the bf16/fp32 ratio its
    measurement gives (each measurement made is appended to `cpu.calls`); its name is
    "Test CPU 9000", and the once-per-process bf16 warning is forgotten."""
    state = SimpleNamespace(calls=[])
    monkeypatch.setattr(precision, "_slow_bf16_warned", False)
    monkeypatch.setattr(precision, "cpu_model", lambda: "Test CPU 9000")

    def set_cpu(flags: frozenset[str], ratio: float = 1.0) -> None:
        monkeypatch.setattr(machine, "cpu_flags", lambda: flags)

        def measured(model, tokens):
            state.calls.append((model.d_model, tokens))
            return ratio
        monkeypatch.setattr(precision, "bf16_ratio", measured)

    state.set = set_cpu
    return state


@pytest.fixture
def autocasts(monkeypatch):
    """The precisions the trainer and the stacked group set up their forward passes in."""
    seen = []

    def recording(p, device):
        seen.append(p)
        return precision.precision_context(p, device)
    monkeypatch.setattr(trainer, "precision_context", recording)
    monkeypatch.setattr(group, "precision_context", recording)
    return seen


def _bf16_warnings(record) -> list[str]:
    return [str(w.message) for w in record if "native bf16" in str(w.message)]


def _meta(run_dir: Path) -> dict:
    return yaml.safe_load((run_dir / "config.yaml").read_text())["meta"]


def _losses(run_dir: Path) -> list[float]:
    return [r["train_loss"] for r in read_metrics(run_dir / "metrics.jsonl")]


# -- the choice ----------------------------------------------------------------------------------
@pytest.mark.parametrize("ratio", [42.0, 0.5])
def test_auto_is_fp32_on_a_cpu_without_native_bf16(cpu, ratio):
    cpu.set(AVX2_ONLY, ratio)
    got = precision.resolve_precision(_cfg("train.precision=auto"), CPU)
    assert got.precision == "fp32"  # whatever the measurement says: the flags decide
    assert "Test CPU 9000" in got.reason and "without native bf16" in got.reason
    assert f"took {'42' if ratio == 42 else '0.50'}x the time" in got.reason
    assert cpu.calls == [(32, 4 * 32)]  # measured at the run's shape, once


@pytest.mark.parametrize("flags", [*WITH_BF16.values(), frozenset()],
                         ids=[*WITH_BF16, "flags-unknown"])
@pytest.mark.parametrize(("ratio", "want"), [(0.5, "bf16"), (0.9, "bf16"), (0.95, "fp32"),
                                             (1.4, "fp32")])
def test_auto_on_another_cpu_is_the_faster_by_the_measured_ratio(cpu, flags, ratio, want):
    cpu.set(flags, ratio)
    got = precision.resolve_precision(_cfg("train.precision=auto"), CPU)
    assert got.precision == want
    assert "Test CPU 9000" in got.reason and f"{ratio:.2f}x" in got.reason
    assert len(cpu.calls) == 1


@pytest.mark.parametrize("flags", [AVX2_ONLY, WITH_BF16["amx_bf16"]])
def test_fp32_and_bf16_are_kept_as_asked_and_measure_nothing(cpu, flags):
    cpu.set(flags, 0.5)
    for asked in ("fp32", "bf16"):
        got = precision.resolve_precision(_cfg(f"train.precision={asked}"), CPU)
        assert got == (asked, f"train.precision={asked}")
    assert cpu.calls == []


def test_auto_on_gpus_measures_nothing(cpu, monkeypatch):
    cpu.set(WITH_BF16["amx_bf16"], 0.5)
    cfg = _cfg("train.precision=auto")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Test GPU")
    for native, want in ((True, "bf16"), (False, "fp32")):  # False: emulated (before sm_80)
        monkeypatch.setattr(torch.cuda, "is_bf16_supported",
                            lambda including_emulation=True, n=native: n or including_emulation)
        got = precision.resolve_precision(cfg, torch.device("cuda"))
        assert got.precision == want and "Test GPU" in got.reason
    assert precision.resolve_precision(cfg, torch.device("mps")).precision == "fp32"
    assert cpu.calls == []


def test_the_measurement_is_one_product_at_the_mlp_shape_and_capped(monkeypatch):
    wide = RunConfig().model.model_copy(update={"d_model": 1024, "n_heads": 16})
    assert precision.probe_shape(RunConfig().model, 10_000) == (512, 256, 1024)
    assert precision.probe_shape(wide, 10_000) == (32, 1024, 4096)  # 2^27 multiply-adds
    assert precision.probe_shape(RunConfig().model, 40) == (40, 256, 1024)
    real_mm, shapes = torch.mm, []

    def counted(a, b):
        shapes.append((tuple(a.shape), tuple(b.shape), a.dtype))
        return real_mm(a, b)
    monkeypatch.setattr(torch, "mm", counted)
    measure = precision._measured_ratio.__wrapped__  # (not the per-process cache)
    ratio = measure(16, 32, 128, 1)
    assert 0 < ratio < float("inf")
    assert {s[:2] for s in shapes} == {((16, 32), (32, 128))}
    assert {s[2] for s in shapes} == {torch.float32, torch.bfloat16}
    assert len(shapes) == 2 * (1 + precision.PROBE_REPEATS)  # a warm-up, then the repeats
    shapes.clear()
    monkeypatch.setattr(precision, "PROBE_SECONDS", 0.0)  # out of time: one timed product each
    measure(16, 32, 128, 1)
    assert len(shapes) == 2 * 2


def test_the_ratio_is_measured_once_per_machine_and_shape(tmp_path, monkeypatch):
    """Two processes on one machine read one ratio for one shape (a shared CPU's quick timing
    swung from 0.14x to 2.35x between processes, and with it the precision of one config)."""
    import json

    monkeypatch.setenv("NORMLAB_CACHE", str(tmp_path))
    measured = []

    def measure(rows, d, f, threads):
        measured.append((rows, d, f))
        return 0.5 + len(measured)  # a different number each time it is measured
    monkeypatch.setattr(precision, "_measured_ratio", measure)
    model = RunConfig().model
    first = precision.bf16_ratio(model, 64)
    assert precision.bf16_ratio(model, 64) == first == 1.5  # as a second process would read it
    assert measured == [(64, 256, 1024)]
    wider = model.model_copy(update={"d_model": 512, "n_heads": 8})
    assert precision.bf16_ratio(wider, 64) == 2.5  # another shape, measured for itself
    kept = json.loads((tmp_path / precision.RATIO_FILE).read_text())
    assert sorted(e["ratio"] for e in kept.values()) == [1.5, 2.5]
    assert all("64x256 @ 256x1024" in k or "64x512 @ 512x2048" in k for k in kept)


def test_the_run_ids_of_existing_runs_do_not_change():
    assert RunConfig().run_id() == "pre-L6-d256-b018512572e8"
    # (the example says `precision: auto` since it was first issued in fp32)
    assert load_run_config(EXAMPLES / "pre.yaml", ["train.precision=fp32"]).run_id() == \
        "pre-L4-d64-f232085dca16"
    assert load_run_config(EXAMPLES / "pre.yaml", ["train.precision=bf16"]).run_id() == \
        "pre-L4-d64-03834ca46e1b"
    auto = load_run_config(EXAMPLES / "pre.yaml", []).run_id()
    assert auto == load_run_config(EXAMPLES / "pre.yaml", ["train.precision=auto"]).run_id()
    assert auto not in ("pre-L4-d64-f232085dca16", "pre-L4-d64-03834ca46e1b")


# -- normlab train -------------------------------------------------------------------------------
def _train_cli(tmp_path: Path, *args: str):
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(TINY))
    return CliRunner().invoke(app, ["train", str(config), "--root", str(tmp_path / "runs"),
                                    *args])


def test_normlab_train_warns_of_emulated_bf16_before_its_first_step(cpu, tmp_path, recwarn,
                                                                    monkeypatch, autocasts):
    cpu.set(AVX2_ONLY, 42.0)
    at_first_step = []
    real = trainer.accumulate_gradients

    def first_step(*args, **kwargs):
        if not at_first_step:
            at_first_step.append(list(_bf16_warnings(recwarn)))
        return real(*args, **kwargs)
    monkeypatch.setattr(trainer, "accumulate_gradients", first_step)
    r = _train_cli(tmp_path, "--set", "train.precision=bf16", "--quiet")
    assert r.exit_code == 0, r.output
    ((message,),) = at_first_step  # said once, before the first step
    assert "Test CPU 9000" in message and "avx512_bf16" in message and "amx_bf16" in message
    assert "took 42x the time of the fp32 one" in message
    assert "--set train.precision=fp32" in message and "precision: auto" in message
    assert [w.category.__name__ for w in recwarn if "native bf16" in str(w.message)] == \
        ["NormlabWarning"]
    assert set(autocasts) == {"bf16"}  # asked for, so trained in it all the same
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert _meta(run_dir)["precision"] == "bf16"


def test_normlab_train_auto_chooses_fp32_where_bf16_is_emulated(cpu, tmp_path, recwarn,
                                                                autocasts):
    cpu.set(AVX2_ONLY, 42.0)
    r = _train_cli(tmp_path, "--set", "train.precision=auto")
    assert r.exit_code == 0, r.output
    assert "trains in fp32 (auto: Test CPU 9000 is a CPU without native bf16" in r.output
    (run_dir,) = (tmp_path / "runs").iterdir()
    meta = _meta(run_dir)
    assert meta["precision"] == "fp32" and meta["dtype"] == "float32"
    assert "42x" in meta["precision_reason"]
    summary = yaml.safe_load((run_dir / "summary.json").read_text())
    assert summary["precision"] == "fp32" and summary["precision_reason"] == \
        meta["precision_reason"]
    assert set(autocasts) == {"fp32"} and not _bf16_warnings(recwarn)


def test_auto_records_bf16_where_it_measured_faster(cpu, tmp_path, autocasts):
    cpu.set(WITH_BF16["amx_bf16"], 0.5)
    s = train_run(_cfg("train.precision=auto"), tmp_path, progress=False)
    meta = _meta(tmp_path / s["run_id"])
    assert meta["precision"] == "bf16" and meta["dtype"] == "bfloat16-autocast"
    assert "0.50x" in meta["precision_reason"]
    assert s["precision"] == "bf16" and s["precision_reason"] == meta["precision_reason"]
    assert set(autocasts) == {"bf16"}


def test_listings_the_report_and_tensorboard_show_what_auto_resolved_to(cpu, tmp_path,
                                                                       autocasts):
    from test_logging import events, hparams_of

    from normlab.report.runs import read_run
    from normlab.train.listing import described_config
    from normlab.train.rundir import read_run_folder

    cpu.set(WITH_BF16["amx_bf16"], 0.5)
    s = train_run(_cfg("train.precision=auto"), tmp_path, progress=False)
    run_dir = tmp_path / s["run_id"]
    assert described_config(read_run_folder(run_dir))["train"]["precision"] == "bf16 (auto)"
    assert read_run(run_dir, tmp_path).flat["train.precision"] == "bf16 (auto)"
    start = hparams_of(events(run_dir))["_hparams_/session_start_info"].session_start_info
    assert start.hparams["train.precision"].string_value == "bf16 (auto)"
    # asked for by name, a precision is shown as asked
    fixed = train_run(_cfg("train.precision=fp32", "train.steps=1"), tmp_path, progress=False)
    assert described_config(read_run_folder(tmp_path / fixed["run_id"]))["train"][
        "precision"] == "fp32"


def test_fp32_and_bf16_runs_record_their_precision(cpu, tmp_path):
    cpu.set(WITH_BF16["amx_bf16"])
    for asked in ("fp32", "bf16"):
        s = train_run(_cfg(f"train.precision={asked}", "train.steps=1"), tmp_path,
                      progress=False)
        assert _meta(tmp_path / s["run_id"])["precision"] == s["precision"] == asked
    assert cpu.calls == []


def test_a_resumed_auto_run_keeps_its_recorded_precision(cpu, tmp_path, autocasts):
    cpu.set(WITH_BF16["amx_bf16"], 0.5)
    cfg = _cfg("train.precision=auto")
    full = train_run(cfg, tmp_path / "a", progress=False)
    part = train_run(cfg, tmp_path / "b", progress=False, interrupt_at=2)
    assert full["precision"] == part["precision"] == "bf16"
    cpu.set(WITH_BF16["amx_bf16"], 2.0)  # measured now, the other one would be chosen
    assert precision.resolve_precision(cfg, CPU).precision == "fp32"
    cpu.calls.clear()
    autocasts.clear()
    resumed = train_run(cfg, tmp_path / "b", progress=False)
    assert resumed["step"] == 4 and resumed["precision"] == "bf16"
    assert resumed["precision_reason"] == full["precision_reason"]
    assert cpu.calls == [] and autocasts == ["bf16"]  # read back, never measured again
    assert _losses(tmp_path / "b" / cfg.run_id()) == _losses(tmp_path / "a" / cfg.run_id())


def test_process_group_ranks_train_in_rank_0s_choice(cpu, tmp_path):
    cpu.set(WITH_BF16["amx_bf16"], 2.0)
    cfg = _cfg("train.precision=auto")
    for rank0_bf16 in (1, 0):
        other = SimpleNamespace(main=False, max=lambda v, b=rank0_bf16: max(v, b))
        got = trainer.agreed_precision(cfg, tmp_path / cfg.run_id(), CPU, other)
        assert got.precision == ("bf16" if rank0_bf16 else "fp32")
    assert cpu.calls == []  # only rank 0 measures
    main = SimpleNamespace(main=True, max=lambda v: v)
    assert trainer.agreed_precision(cfg, tmp_path / cfg.run_id(), CPU, main).precision == "fp32"
    assert len(cpu.calls) == 1


# -- stacked groups ------------------------------------------------------------------------------
def test_a_stacked_group_decides_once_and_keeps_what_members_recorded(cpu, tmp_path, autocasts):
    cpu.set(WITH_BF16["amx_bf16"], 0.5)
    a, b, c, d, e, f = (_cfg("train.precision=auto", f"train.lr={lr}")
                        for lr in (1e-3, 2e-3, 3e-3, 4e-3, 5e-3, 6e-3))
    out = train_group([a, b], tmp_path)
    assert [s["precision"] for s in out.values()] == ["bf16", "bf16"]
    assert len(cpu.calls) == 1  # measured once for the group
    assert {_meta(tmp_path / cfg.run_id())["precision"] for cfg in (a, b)} == {"bf16"}
    for cfg in (c, d):  # begun in bf16, measured 0.5x
        assert train_run(cfg, tmp_path, progress=False, interrupt_at=2)["precision"] == "bf16"
    # e begins where bf16 measures 0.6x: one stack with c, each keeping its own reason
    cpu.set(WITH_BF16["amx_bf16"], 0.6)
    autocasts.clear()
    out = train_group([e, c], tmp_path)
    assert [(s["step"], s["precision"]) for s in out.values()] == [(4, "bf16"), (4, "bf16")]
    assert "0.60x" in out[e.run_id()]["precision_reason"]
    assert "0.50x" in out[c.run_id()]["precision_reason"]
    assert autocasts == ["bf16"]
    # f begins where bf16 measures slower, d resumes in the bf16 it began in: a stack each
    cpu.set(WITH_BF16["amx_bf16"], 2.0)
    autocasts.clear()
    out = train_group([f, d], tmp_path)
    assert {k: (s["outcome"], s["step"], s["precision"]) for k, s in out.items()} == {
        d.run_id(): ("stalled", 4, "bf16"), f.run_id(): ("stalled", 4, "fp32")}
    assert sorted(autocasts) == ["bf16", "fp32"]


def test_a_signal_stops_a_groups_later_stacks_too(cpu, tmp_path, monkeypatch):
    cpu.set(WITH_BF16["amx_bf16"], 0.5)
    began, fresh = (_cfg("train.precision=auto", f"train.lr={lr}") for lr in (1e-3, 2e-3))
    train_run(began, tmp_path, progress=False, interrupt_at=1)  # recorded bf16
    cpu.set(WITH_BF16["amx_bf16"], 2.0)  # fresh: fp32, a second stack, after bf16's
    real = group._GroupLoop.train_step

    def step_then_signal(self):
        real(self)
        signal.raise_signal(signal.SIGINT)  # as Ctrl-C during the first stack's step
    monkeypatch.setattr(group._GroupLoop, "train_step", step_then_signal)
    out = train_group([began, fresh], tmp_path)
    assert {k: (s["outcome"], s["reason"], s["step"]) for k, s in out.items()} == {
        began.run_id(): ("interrupted", "signal", 2), fresh.run_id(): ("interrupted", "signal", 0)}


# -- the warning ---------------------------------------------------------------------------------
def test_native_bf16_reads_the_cpu_flags(cpu):
    cpu.set(AVX2_ONLY)
    assert machine.native_bf16() is False
    for flags in WITH_BF16.values():
        cpu.set(flags)
        assert machine.native_bf16() is True
    cpu.set(frozenset())  # flags unknown (not Linux): nothing is claimed
    assert machine.native_bf16() is None


def test_the_real_cpu_flags_are_read():
    flags = machine.cpu_flags()
    assert isinstance(flags, frozenset)
    if sys.platform == "linux" and os.uname().machine == "x86_64":
        assert "sse2" in flags  # every x86-64 CPU has it


def test_bf16_warns_once_per_process_on_a_cpu_without_native_bf16(cpu, tmp_path, recwarn):
    cpu.set(AVX2_ONLY, 37.0)
    precision.warn_slow_bf16(_cfg(), "fp32", CPU)
    assert not _bf16_warnings(recwarn) and cpu.calls == []  # fp32 runs: nothing to say
    s = train_run(_cfg("train.steps=1", "train.precision=bf16"), tmp_path / "a", progress=False)
    assert s["step"] == 1
    (message,) = _bf16_warnings(recwarn)
    assert "took 37x the time" in message and "train.precision=fp32" in message
    # once per process: a second run (or a stacked group, a sweep worker's next run) is quiet
    train_run(_cfg("train.steps=1", "train.precision=bf16", "train.seed=1"), tmp_path / "b",
              progress=False)
    precision.warn_slow_bf16(_cfg(), "bf16", CPU)
    assert len(_bf16_warnings(recwarn)) == 1 and len(cpu.calls) == 1


@pytest.mark.parametrize("flags", [*WITH_BF16.values(), frozenset()],
                         ids=[*WITH_BF16, "flags-unknown"])
def test_bf16_does_not_warn_where_it_is_not_emulated(cpu, flags, recwarn):
    cpu.set(flags, 37.0)
    precision.warn_slow_bf16(_cfg(), "bf16", CPU)
    assert precision.slow_bf16_note("bf16", CPU, 37.0) is None
    assert not _bf16_warnings(recwarn) and cpu.calls == []


def test_a_stacked_group_warns_through_the_same_check(cpu, tmp_path, recwarn):
    cpu.set(AVX2_ONLY, 37.0)
    train_group([_cfg("train.steps=1", "train.precision=bf16", f"train.lr={lr}")
                 for lr in (1e-3, 2e-3)], tmp_path)
    (message,) = _bf16_warnings(recwarn)
    assert "37x" in message


# -- normlab plan --time -------------------------------------------------------------------------
@pytest.fixture
def peaks(monkeypatch):
    """The dtypes `normlab plan --time` measured a GEMM peak in (each a fixed 500 GFLOP/s)."""
    dtypes = []
    monkeypatch.setattr(perf, "gemm_peak_tflops", lambda dtype: dtypes.append(dtype) or 0.5)
    return dtypes


def _plan_time(tmp_path: Path, train: dict | None, *sets: str):
    config = tmp_path / "plan.yaml"
    config.write_text(yaml.safe_dump({"model": {"placement": "pre", "n_blocks": 1,
                                                "d_model": 16, "n_heads": 1},
                                      **({"train": train} if train else {})}))
    r = CliRunner().invoke(app, ["plan", "--config", str(config), "--time",
                                 *(f"--set={s}" for s in sets)], terminal_width=400)
    assert r.exit_code == 0, r.output
    lines = r.output.strip().splitlines()
    assert lines[-1].startswith("steady forward+backward")
    return lines


def test_plan_time_says_bf16_is_emulated_and_times_fp32(cpu, tmp_path, peaks):
    cpu.set(AVX2_ONLY, 42.0)
    lines = _plan_time(tmp_path, {"precision": "bf16"})
    note, steady = lines[-2:]  # said before the timing
    assert "Test CPU 9000" in note and "took 42x the time" in note
    assert "--set train.precision=fp32" in note and "Timed in fp32 here" in note
    assert steady.startswith("steady forward+backward, batch") and peaks == [torch.float32]


def test_plan_time_says_what_auto_chooses_and_times_in_it(cpu, tmp_path, peaks):
    cpu.set(WITH_BF16["amx_bf16"], 0.5)
    lines = _plan_time(tmp_path, {"precision": "fp32"}, "train.precision=auto")
    assert lines[-2].startswith("precision: bf16 (auto: on Test CPU 9000 (native bf16), ")
    assert lines[-1].startswith("steady forward+backward in bf16,") and "bf16 GEMM peak" in \
        lines[-1]
    assert peaks == [torch.bfloat16]
    cpu.set(AVX2_ONLY, 42.0)
    peaks.clear()
    lines = _plan_time(tmp_path, {"precision": "auto"})
    assert lines[-2].startswith("precision: fp32 (auto: Test CPU 9000 is a CPU without native")
    assert "42x" in lines[-2] and peaks == [torch.float32]


def test_plan_time_in_fp32_says_nothing_and_measures_nothing(cpu, tmp_path, peaks):
    cpu.set(AVX2_ONLY, 42.0)
    for train in (None, {"precision": "fp32"}):
        lines = _plan_time(tmp_path, train)
        assert not any("precision" in line or "bf16" in line for line in lines)
    assert cpu.calls == [] and peaks == [torch.float32] * 2
    r = CliRunner().invoke(app, ["plan", "--time", "--set", "train.precision=fp16"])
    assert r.exit_code == 2 and "fp16" in r.output
