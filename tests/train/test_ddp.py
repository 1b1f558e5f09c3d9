"""Multi-process training (DDP on gloo): the same run, whatever the number of processes."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file
from subprocess_env import subprocess_env

from normlab.config import ConfigError, load_run_config
from normlab.data import BatchSampler, batches
from normlab.train import distributed, read_summary, train_run
from normlab.train.logging import read_metrics

ARGS = ["model.n_blocks=2", "model.d_model=32", "model.n_heads=2", "model.max_seq_len=32",
        "data.seq_len=32", "train.batch_size=8", "train.eval_batches=2", "train.log_every=1",
        "train.steps=6", "train.eval_every=3", "train.grad_accum=2",
        "train.block_stats_every=2", "train.warmup=2", "train.device=cpu"]
# the k-hop task (data.task=khop): its accuracy is counted over every rank's shard
KHOP_ARGS = ["data.task=khop", "model.vocab_size=8", "model.n_blocks=2", "model.d_model=32",
             "model.n_heads=2", "model.max_seq_len=32", "data.seq_len=32", "train.batch_size=8",
             "train.eval_batches=2", "train.steps=4", "train.eval_every=2", "train.lr=3e-3",
             "train.device=cpu"]
TIMING = ("time_s", "tokens_per_s")


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> Path:
    """The reference: the run trained by this (single) process."""
    root = tmp_path_factory.mktemp("one")
    s = train_run(load_run_config(None, ARGS), root, progress=False)
    assert s["outcome"] == "stalled"  # 6 steps end above the unigram entropy
    return root / s["run_id"]


def assert_same_run(a: Path, b: Path, rel: float = 1e-4) -> None:
    """Same logged metrics (every loss, grad norm, val loss, block statistic) within `rel`, and
    the same final weights."""
    rows_a, rows_b = read_metrics(a / "metrics.jsonl"), read_metrics(b / "metrics.jsonl")
    assert [r["step"] for r in rows_a] == [r["step"] for r in rows_b]
    for ra, rb in zip(rows_a, rows_b, strict=True):
        keys = set(ra) - set(TIMING)
        assert keys == set(rb) - set(TIMING)
        for k in keys - {"step"}:
            assert rb[k] == pytest.approx(ra[k], rel=rel), (ra["step"], k)
    wa = load_file(str(a / "checkpoint" / "model.safetensors"))
    wb = load_file(str(b / "checkpoint" / "model.safetensors"))
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], rtol=1e-4, atol=1e-5, msg=k)


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "normlab", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=180,
                          env=subprocess_env())


def test_cli_two_processes_match_one(tmp_path, one_process):
    r = _cli("train", *(f"--set={a}" for a in ARGS), "--nproc=2", "--threads=1", "--quiet",
             "--root=two", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("stalled at step 6") == 1  # rank 0 alone reports
    two = tmp_path / "two" / one_process.name  # the process count does not change the run id
    assert_same_run(one_process, two)
    meta = (two / "config.yaml").read_text()
    assert "world_size: 2" in meta
    assert read_summary(two)["world_size"] == 2


def test_two_processes_with_activation_checkpointing_match_one_without(tmp_path, one_process):
    """An execution option on top of DDP: the same run id and the same results."""
    r = _cli("train", *(f"--set={a}" for a in ARGS), "--set=train.activation_checkpointing=true",
             "--nproc=2", "--threads=1", "--quiet", "--root=two", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert_same_run(one_process, tmp_path / "two" / one_process.name)


def test_batch_not_divisible_is_a_clear_error(tmp_path):
    r = _cli("train", *(f"--set={a}" for a in ARGS), "--nproc=3", "--root=runs", cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "train.batch_size=8" in r.stderr and "divisible" in r.stderr
    assert not (tmp_path / "runs").exists()
    with pytest.raises(ConfigError, match="multiple of 3"):
        distributed.check_divisible(8, 3)
    assert distributed.check_divisible(8, 2) == 4


class _SignalOnBatch(BatchSampler):
    """A sampler that delivers SIGTERM to its own process when it draws batch `at`."""

    at = -1

    def batch(self, step):
        if step == self.at:
            os.kill(os.getpid(), signal.SIGTERM)
        return super().batch(step)


class _FailOnBatch(BatchSampler):
    at = -1

    def batch(self, step):
        if step == self.at:
            raise RuntimeError("rank 1 broke")
        return super().batch(step)


def _rank(rank: int, world: int, port: int, root: str, scenario: str) -> None:
    """One rank of a spawned process group; writes what `train_run` returned to a JSON file."""
    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    cfg = load_run_config(None, KHOP_ARGS if scenario == "khop" else ARGS)
    out = {}
    with distributed.process_group(torch.device("cpu")):
        # only rank 1 is signalled or breaks, while drawing step 2's batch
        if rank == 1 and scenario in ("signal", "fail"):
            sampler = _SignalOnBatch if scenario == "signal" else _FailOnBatch
            sampler.at = 2 * cfg.train.grad_accum
            batches.BatchSampler = sampler  # the class a text run's sampler is made of
        out["first"] = train_run(cfg, root, progress=False)
        if scenario == "signal":
            state = Path(root) / cfg.run_id() / "checkpoint" / "trainer_state.json"
            out["checkpoint_step"] = json.loads(state.read_text())["step"]
            batches.BatchSampler = BatchSampler
            out["resumed"] = train_run(cfg, root, progress=False)
        # written before the group is torn down (see `_spawn`)
        Path(root, f"rank{rank}.json").write_text(json.dumps(out))


def _spawn(tmp_path: Path, scenario: str) -> list[dict]:
    try:
        mp.spawn(_rank, args=(2, distributed.free_port(), str(tmp_path), scenario), nprocs=2)
    except mp.ProcessExitedException as e:
        # gloo's teardown can abort a rank after it has left the process group and written its
        # results ("terminate called without an active exception", SIGABRT, in about one run of
        # this file in three on a 2-core machine; a known fault of the teardown: the ranks now
        # wait for each other before it (`distributed._leave_together`), which is not yet shown
        # to remove it: 0 aborts in 6 spawns of the signal scenario with the wait and 0 in 6
        # without).
        # Only that is let through: an abort before both ranks wrote their results fails here.
        written = all((tmp_path / f"rank{r}.json").is_file() for r in range(2))
        if e.signal_name != "SIGABRT" or not written:
            raise
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]


def test_signal_on_one_rank_stops_all_and_resume_matches(tmp_path, one_process):
    ranks = _spawn(tmp_path, "signal")
    for r in ranks:  # both stopped at the same step boundary, for the signal rank 1 received
        assert (r["first"]["outcome"], r["first"]["step"], r["first"]["reason"]) == (
            "interrupted", 3, "signal")
        assert r["resumed"]["outcome"] == "stalled"
    assert ranks[0]["checkpoint_step"] == 3
    assert ranks[0]["resumed"]["val_loss"] == ranks[1]["resumed"]["val_loss"]
    assert_same_run(one_process, tmp_path / one_process.name)


def test_failure_on_one_rank_does_not_hang_the_others(tmp_path, monkeypatch):
    monkeypatch.setenv(distributed.TIMEOUT_ENV, "20")
    ranks = _spawn(tmp_path, "fail")
    assert ranks[1]["first"]["outcome"] == "failed"
    assert ranks[1]["first"]["message"] == "rank 1 broke"
    # rank 0 finds its peer gone (at the latest after the timeout) and records the failure
    s = read_summary(tmp_path / ranks[0]["first"]["run_id"])
    assert s["outcome"] == "failed" and ranks[0]["first"]["outcome"] == "failed"
    assert s["step"] == 2


def test_two_processes_report_the_accuracy_of_one(tmp_path):
    one = train_run(load_run_config(None, KHOP_ARGS), tmp_path / "one", progress=False)
    ranks = _spawn(tmp_path, "khop")
    hops = {f"val_acc_hop{k}" for k in (1, 2, 3, 4)}
    for r in ranks:
        s = r["first"]
        assert s["outcome"] == one["outcome"] and set(s) >= hops
        for key in hops | {"val_acc"}:
            assert s[key] == pytest.approx(one[key], abs=0.02), key
    assert_same_run(tmp_path / "one" / one["run_id"], tmp_path / one["run_id"])
