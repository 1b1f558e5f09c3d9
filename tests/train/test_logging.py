"""The training log: a smoothed progress line with val loss, grad norm and MFU; per-block norms by
default; the run's config in TensorBoard as text and as hparams with its final metrics."""

import re

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams.api_pb2 import Status
from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

from normlab.config import load_run_config
from normlab.train import train_run
from normlab.train.group import train_group
from normlab.train.logging import (
    Throughput,
    flat_hparams,
    percent,
    progress_info,
    read_metrics,
)
from normlab.train.perf import quick_peak_tflops, train_flops_per_token
from normlab.train.trainer import block_stats_every

TINY = ["model.n_blocks=2", "model.d_model=32", "model.n_heads=2", "model.max_seq_len=32",
        "data.seq_len=32", "train.batch_size=8", "train.eval_batches=2", "train.steps=8",
        "train.log_every=4", "train.eval_every=4", "train.device=cpu"]


def tiny(*extra: str):
    return load_run_config(None, TINY + list(extra))


def test_throughput_skips_warmup_and_smooths():
    speed = Throughput(1000, flops_per_token=6e6, peak_tflops=1.0, skip=2, decay=0.5)
    for dt in (5.0, 3.0):  # first calls: allocation, caches; not averaged
        speed.update(dt)
        assert speed.tokens_per_s is None and speed.describe() == "warm-up"
    speed.update(0.1)
    assert speed.step_s == pytest.approx(0.1)
    speed.update(0.3)  # one slow step moves the average halfway, not all the way
    assert speed.step_s == pytest.approx(0.2)
    assert speed.tokens_per_s == pytest.approx(5000)
    assert speed.mfu == pytest.approx(5000 * 6e6 / 1e12)
    assert speed.describe() == "200 ms, 5k tok/s, mfu 3.0%"
    assert Throughput(1000).mfu is None  # no peak measured: no MFU shown


def test_progress_info_reads_like_nanogpt():
    speed = Throughput(45_100, skip=0)
    speed.update(1.0)
    line = progress_info(2.4312, 1e-3, 0.84, 2.5021, speed)
    assert line == "loss 2.4312, val 2.5021, lr 1.00e-03, grad norm 0.84, 1,000 ms, 45.1k tok/s"
    assert "val" not in progress_info(2.4, 1e-3, 0.84, None, speed)
    # between evaluations the last validation loss carries the step it was computed at
    assert progress_info(2.4, 1e-3, 0.84, 2.5021, speed, val_step=250, step=250).startswith(
        "loss 2.4000, val 2.5021, lr")
    assert progress_info(2.4, 1e-3, 0.84, 2.5021, speed, val_step=250, step=300).startswith(
        "loss 2.4000, val 2.5021 (step 250), lr")
    assert progress_info(2.4, 1e-3, 0.84, 2.5021, speed, step=300).startswith(
        "loss 2.4000, val 2.5021 (before this start), lr")


def test_an_mfu_above_one_is_not_shown():
    """A peak measured while another process held the cores reads the machine low: a share
    above 100% is impossible, so it is left out rather than shown."""
    speed = Throughput(1000, flops_per_token=1e9, peak_tflops=1.0, skip=0)
    speed.update(1.0)  # 1e12 FLOP/s against a 1 TFLOP/s peak: exactly 100%
    assert speed.mfu == pytest.approx(1.0) and speed.describe().endswith("mfu 100%")
    speed.update(0.5)  # the average step now 0.95 s: above the peak
    assert speed.mfu is None and "mfu" not in speed.describe()


def test_a_tiny_mfu_keeps_two_significant_digits_and_says_why_on_a_gpu():
    """A study-sized run on a GPU reaches 0.02% of its peak: `0.0%` would round the truth away.
    On a GPU the line says the step is launch-bound; a CPU's small share has no such reason."""
    assert [percent(x) for x in (0.03, 0.123, 0.00021, 1.0, 0.0)] == [
        "3.0%", "12%", "0.021%", "100%", "0%"]
    gpu = Throughput(1000, flops_per_token=1e5, peak_tflops=500.0, skip=0, device_type="cuda")
    gpu.update(0.01)  # 1e10 FLOP/s of 5e14: 0.002%
    assert gpu.describe() == ("10 ms, 100k tok/s, mfu 0.0020% (launch-bound: too small for this "
                              "GPU; stacked runs fill it)")
    cpu = Throughput(1000, flops_per_token=1e5, peak_tflops=500.0, skip=0)
    cpu.update(0.01)
    assert cpu.describe() == "10 ms, 100k tok/s, mfu 0.0020%"
    busy = Throughput(1000, flops_per_token=1e9, peak_tflops=500.0, skip=0, device_type="cuda")
    busy.update(0.01)  # 1e14 of 5e14: 20%, not launch-bound
    assert busy.describe() == "10 ms, 100k tok/s, mfu 20%"


def test_train_run_prints_the_smoothed_line(tmp_path, capsys):
    s = train_run(tiny(), tmp_path, progress=True)
    assert s["outcome"] in ("completed", "stalled")
    lines = [ln for ln in capsys.readouterr().err.splitlines() if " step " in ln]
    assert [re.search(r"step (\d+)/8", ln).group(1) for ln in lines] == ["4", "8"]
    last = lines[-1]
    val = read_metrics(tmp_path / s["run_id"] / "metrics.jsonl")[-1]["val_loss"]
    assert f"val {val:.4f}" in last and "grad norm" in last
    mfu = float(re.search(r"mfu ([\d.]+)%", last).group(1))
    rate = re.search(r"([\d.]+)(k?) tok/s", last)
    tokens_per_s = float(rate.group(1)) * (1e3 if rate.group(2) else 1.0)
    # MFU is the model's matrix FLOPs at the printed rate over the GEMM peak the run measured
    # (measured once per process, so this call returns the run's own number); the tolerance is
    # the line's rounding (3 digits of tok/s, 2 significant digits of MFU)
    cfg = tiny()
    flops = tokens_per_s * train_flops_per_token(cfg.model, cfg.data.seq_len)
    want = 100 * flops / (quick_peak_tflops(torch.float32, "cpu") * 1e12)
    assert mfu == pytest.approx(want, rel=0.06), (last, want)
    assert 0 < mfu <= 100  # a model cannot run faster than the GEMM peak it is made of


def test_group_prints_a_line_for_the_stack(tmp_path, capsys):
    cfgs = [tiny("train.lr=1e-3"), tiny("train.lr=3e-3", "train.seed=1")]
    out = train_group(cfgs, tmp_path, progress=True)
    assert {s["outcome"] for s in out.values()} <= {"completed", "stalled"}
    last = [ln for ln in capsys.readouterr().err.splitlines() if "step 8/8" in ln][-1]
    assert "2 runs, loss " in last and "tok/s" in last and "in all" in last


def events(run_dir) -> EventAccumulator:
    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"tensors": 0, "scalars": 0})
    acc.Reload()
    return acc


def test_default_block_stats_cadence():
    def every(*extra):
        return block_stats_every(tiny(*extra).train)

    assert every("train.log_every=10") == 10 and every("train.log_every=25") == 25
    assert every("train.log_every=1") == 10 and every("train.log_every=4") == 12
    assert every("train.block_stats_every=1") == 1 and every("train.block_stats_every=0") == 0


def test_block_norms_are_logged_by_default_at_the_log_cadence(tmp_path):
    s = train_run(tiny("train.log_every=5", "train.steps=10", "train.eval_every=5"), tmp_path,
                  progress=False)
    rows = read_metrics(tmp_path / s["run_id"] / "metrics.jsonl")
    assert [r["step"] for r in rows] == [5, 10]
    assert not any(k.startswith("blocks.") for k in rows[0])  # every 10th step at most
    for r in rows[1:]:
        for i in range(2):
            assert r[f"blocks.{i}.stream_norm"] > 0
            assert r[f"blocks.{i}.attn.grad_norm"] > 0 and r[f"blocks.{i}.mlp.grad_norm"] > 0
    scalars = events(tmp_path / s["run_id"]).Tags()["scalars"]
    assert "blocks/1/stream_norm" in scalars and "blocks/0/mlp/grad_norm" in scalars
    off = train_run(tiny("train.block_stats_every=0"), tmp_path, progress=False)
    assert not any(k.startswith("blocks.")
                   for r in read_metrics(tmp_path / off["run_id"] / "metrics.jsonl") for k in r)


def hparams_of(acc: EventAccumulator) -> dict[str, HParamsPluginData]:
    content = acc.PluginTagToContent("hparams")
    return {tag: HParamsPluginData.FromString(raw) for tag, raw in content.items()}


def test_config_and_hparams_in_tensorboard(tmp_path):
    cfg = tiny("train.lr=2e-3")
    s = train_run(cfg, tmp_path, progress=False)
    acc = events(tmp_path / s["run_id"])
    text = acc.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "    placement: pre" in text and "    lr: 0.002" in text
    data = hparams_of(acc)
    start = data["_hparams_/session_start_info"].session_start_info.hparams
    assert start["train.lr"].number_value == pytest.approx(2e-3)
    assert start["model.placement"].string_value == "pre"
    assert start["outcome"].string_value == s["outcome"]
    metrics = {m.name.tag for m in data["_hparams_/experiment"].experiment.metric_infos}
    assert {"final/val_loss", "final/train_loss", "final/best_val_loss"} <= metrics
    assert acc.Scalars("final/val_loss")[-1].value == pytest.approx(s["val_loss"], rel=1e-6)
    end = data["_hparams_/session_end_info"].session_end_info
    # a stalled run (a tiny one ends above the unigram entropy) is a failure, like a divergence
    expected = "STATUS_SUCCESS" if s["outcome"] == "completed" else "STATUS_FAILURE"
    assert end.status == Status.Value(expected)


def test_diverged_run_is_a_failure_in_hparams(tmp_path):
    cfg = tiny("model.placement=post", "train.steps=60", "train.lr=50", "train.grad_clip=null",
               "train.schedule=constant")
    s = train_run(cfg, tmp_path, progress=False)
    assert s["outcome"] == "diverged"
    data = hparams_of(events(tmp_path / s["run_id"]))
    assert data["_hparams_/session_end_info"].session_end_info.status == Status.Value(
        "STATUS_FAILURE")


def test_stacked_members_get_their_own_hparams(tmp_path):
    cfgs = [tiny("train.lr=1e-3"), tiny("train.lr=3e-3", "train.seed=1")]
    train_group(cfgs, tmp_path)
    for cfg in cfgs:
        start = hparams_of(events(tmp_path / cfg.run_id()))["_hparams_/session_start_info"]
        assert start.session_start_info.hparams["train.lr"].number_value == cfg.train.lr


def test_flat_hparams_keeps_only_scalar_types():
    flat = flat_hparams({"model": {"n_blocks": 2, "block_placements": None,
                                   "custom": ["pre", "post"]}, "train": {"compile": False}})
    assert flat == {"model.n_blocks": 2, "model.block_placements": "null",
                    "model.custom": '["pre", "post"]', "train.compile": False}


def test_every_logged_scalar_reaches_tensorboard_with_its_step_and_value(tmp_path):
    s = train_run(tiny(), tmp_path, progress=False)
    rows = read_metrics(tmp_path / s["run_id"] / "metrics.jsonl")
    acc = events(tmp_path / s["run_id"])
    for key in ("train_loss", "lr", "grad_norm", "val_loss"):
        logged = [(r["step"], r[key]) for r in rows if key in r]
        assert logged
        got = acc.Scalars(key)
        assert [e.step for e in got] == [step for step, _ in logged]
        assert [e.value for e in got] == pytest.approx([v for _, v in logged], rel=1e-6)


def test_records_are_on_the_disk_before_each_checkpoint(tmp_path, monkeypatch):
    """However long the log waits between flushes, a checkpoint's step finds its record (and
    every earlier one) in metrics.jsonl: a crash after a checkpoint loses nothing a resume
    keeps."""
    from normlab.train import trainer
    from normlab.train.logging import MetricsLog

    monkeypatch.setattr(MetricsLog, "FLUSH_EVERY_S", 1e9)
    seen = {}
    save = trainer.save_checkpoint

    def checked(path, model, optimizer, state):
        seen[state["step"]] = [r["step"] for r in read_metrics(path.parent / "metrics.jsonl")]
        return save(path, model, optimizer, state)

    monkeypatch.setattr(trainer, "save_checkpoint", checked)
    train_run(tiny("train.log_every=1", "train.checkpoint_every=3"), tmp_path, progress=False)
    assert seen and all(logged == list(range(1, step + 1)) for step, logged in seen.items())


def test_metrics_log_flushes_by_time_and_on_request(tmp_path, monkeypatch):
    from normlab.train.logging import MetricsLog

    clock = [100.0]
    monkeypatch.setattr("normlab.train.logging.time.monotonic", lambda: clock[0])
    log = MetricsLog(tmp_path / "metrics.jsonl")
    log.write({"step": 1, "train_loss": 2.0})  # the first record is flushed at once
    assert [r["step"] for r in read_metrics(log.path)] == [1]
    log.write({"step": 2, "train_loss": 1.9})
    assert [r["step"] for r in read_metrics(log.path)] == [1]
    clock[0] += MetricsLog.FLUSH_EVERY_S
    log.write({"step": 3, "train_loss": 1.8})
    assert [r["step"] for r in read_metrics(log.path)] == [1, 2, 3]
    log.write({"step": 4, "train_loss": 1.7})
    log.flush()
    assert [r["step"] for r in read_metrics(log.path)] == [1, 2, 3, 4]
    log.close()
