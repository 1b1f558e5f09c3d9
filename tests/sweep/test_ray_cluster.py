"""Sweeps on a real Ray cluster: a head node started here as a separate process with `ray start
--head` (one CPU, a small object store, its own temp dir), reached by `host:port` with Ray's token
authentication, and stopped at the end by killing its processes, even when a test fails.

The head is started the way a machine that once ran a local Ray instance starts it: a token in
`~/.ray/auth_token` (HOME is a folder of the test's), RAY_AUTH_MODE unset, so `ray start --head`
turns token authentication on.
"""

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from optional_packages import reason
from subprocess_env import subprocess_env

from normlab.sweep.summarize import collect
from normlab.train import read_summary

pytest.importorskip("ray", reason=reason("ray"))

RAY = Path(sys.executable).with_name("ray")
TINY = """
base:
  model: {n_blocks: 1, d_model: 16, n_heads: 2, max_seq_len: 16}
  data: {seq_len: 16}
  train: {steps: STEPS, batch_size: 2, eval_batches: 1, eval_every: EVAL, log_every: 1,
          checkpoint_every: 5, device: cpu}
axes:
  train.seed: [0, 1]
"""


@dataclass
class Cluster:
    address: str
    home: Path          # HOME of the head, holding the cluster's token in .ray/auth_token
    tmp: Path

    def env(self, home: Path | None = None, **extra: str) -> dict[str, str]:
        """The environment of a process on this machine that uses the cluster: no RAY_AUTH_*
        variable unless given."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
        return subprocess_env(env, HOME=str(home or self.home), RAY_USAGE_STATS_ENABLED="0",
                              **extra)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _processes_under(path: Path) -> list[int]:
    """Pids of the processes whose command line names `path` (the head's temp dir): only this
    cluster's; `ray stop` would stop every Ray instance on the machine."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if str(path) in (proc / "cmdline").read_bytes().decode(errors="replace"):
                    pids.append(int(proc.name))
            except OSError:
                continue
    return [p for p in pids if p != os.getpid()]


@pytest.fixture(scope="module")
def cluster():
    tmp = Path(tempfile.mkdtemp(prefix="nlray"))  # short: Ray's socket paths live under it
    home = tmp / "home"
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text(secrets.token_hex(16))
    port = _free_port()
    c = Cluster(f"127.0.0.1:{port}", home, tmp)
    log = (tmp / "head.log").open("w")
    head = subprocess.Popen(
        [str(RAY), "start", "--head", "--port", str(port), "--node-ip-address", "127.0.0.1",
         "--num-cpus", "1", "--object-store-memory", str(80 * 2**20),
         "--include-dashboard=false", "--disable-usage-stats", "--temp-dir", str(tmp / "t"),
         "--block"],
        env=c.env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + 120
        while "Ray runtime started" not in (tmp / "head.log").read_text():
            assert head.poll() is None and time.time() < deadline, (
                "ray start --head did not come up:\n" + (tmp / "head.log").read_text()[-3000:])
            time.sleep(0.2)
        assert "Token authentication is enabled" in (tmp / "head.log").read_text()
        yield c
    finally:
        gone = (ProcessLookupError, PermissionError)
        with contextlib.suppress(*gone, subprocess.TimeoutExpired):
            head.terminate()  # --block: `ray start` drains the node and stops its processes
            head.wait(timeout=30)
        for _ in range(2):  # what is left (e.g. after a timeout above)
            for pid in _processes_under(tmp):
                with contextlib.suppress(*gone):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.5)
        log.close()
        left = _processes_under(tmp)
        shutil.rmtree(tmp, ignore_errors=True)
        assert not left, f"cluster processes left: {left}"


def _sweep(cluster: Cluster, spec: Path, root: Path, env: dict[str, str], *extra: str,
           **kwargs):
    cmd = [sys.executable, "-m", "normlab", "sweep", "run", str(spec), "--root", str(root),
           "--executor", "ray", "--address", cluster.address, "--workers", "0", *extra]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, **kwargs)


def test_sweep_reaches_a_token_cluster_by_host_port(cluster, tmp_path):
    """`--address HOST:PORT` finds the token where Ray keeps it, as `--address auto` does."""
    spec = tmp_path / "tiny.yaml"
    spec.write_text(TINY.replace("STEPS", "3").replace("EVAL", "3"))
    r = _sweep(cluster, spec, tmp_path / "sweep", cluster.env())
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert "InvalidAuthToken" not in out
    summaries = [read_summary(p) for p in (tmp_path / "sweep").iterdir() if p.is_dir()]
    assert all(s["outcome"] in ("completed", "stalled") for s in summaries)
    assert all(s["step"] == 3 and s["val_loss"] > 0 for s in summaries)


def test_a_missing_or_wrong_token_is_one_clear_error(cluster, tmp_path):
    """Refused at once with what to do, not after 20 s of InvalidAuthToken lines."""
    spec = tmp_path / "tiny.yaml"
    spec.write_text(TINY.replace("STEPS", "3").replace("EVAL", "3"))
    empty = tmp_path / "home"
    empty.mkdir()
    r = _sweep(cluster, spec, tmp_path / "sweep", cluster.env(home=empty))
    assert r.returncode == 2, r.stdout + r.stderr
    err = " ".join(r.stderr.split())  # the console wraps long lines
    assert "requires token authentication, and this process has no token" in err
    assert "ray get-auth-token" in err and "Traceback" not in err
    assert r.stderr.count("InvalidAuthToken") <= 1, r.stderr  # Ray's own log line, once

    # the lighter checks without the sweep around them: the same connection code, in a fresh
    # process (Ray keeps its token mode per process)
    probe = ("import sys; from normlab.sweep.ray_executor import ExecutorError, ray_session\n"
             "try:\n    with ray_session(sys.argv[1], 1): pass\n"
             "except ExecutorError as e:\n    print(e); sys.exit(2)\n")
    wrong = subprocess.run([sys.executable, "-c", probe, cluster.address], capture_output=True,
                           text=True, timeout=120,
                           env=cluster.env(home=empty, RAY_AUTH_TOKEN="not-the-token"))
    assert wrong.returncode == 2, wrong.stdout + wrong.stderr
    assert "refused the token from the environment variable RAY_AUTH_TOKEN" in wrong.stdout
    missing = subprocess.run([sys.executable, "-c", probe, cluster.address], capture_output=True,
                             text=True, timeout=120,
                             env=cluster.env(home=empty, RAY_AUTH_TOKEN_PATH=str(tmp_path / "no")))
    assert missing.returncode == 2 and "RAY_AUTH_TOKEN_PATH=" in missing.stdout, missing.stdout
    # the right token from a file named by RAY_AUTH_TOKEN_PATH connects
    token_file = tmp_path / "token"
    token_file.write_text((cluster.home / ".ray" / "auth_token").read_text())
    ok = subprocess.run([sys.executable, "-c", probe, cluster.address], capture_output=True,
                        text=True, timeout=120,
                        env=cluster.env(home=empty, RAY_AUTH_TOKEN_PATH=str(token_file)))
    assert ok.returncode == 0, ok.stdout + ok.stderr


def test_ctrl_c_records_where_each_run_stopped(cluster, tmp_path):
    """After Ctrl-C the interrupted run's summary holds its real step and losses, and the table
    shows them (not `running, step 0`)."""
    spec = tmp_path / "long.yaml"
    spec.write_text(TINY.replace("STEPS", "5000").replace("EVAL", "10"))
    root = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "normlab", "sweep", "run", str(spec), "--root", str(root),
           "--executor", "ray", "--address", cluster.address, "--workers", "0", "--quiet"]
    # Ctrl-C as in a terminal: a suite started in the background (`cmd &` in a script) runs
    # with SIGINT ignored, which its children inherit, and a sweep then rightly ignores it
    proc = subprocess.Popen(cmd, env=cluster.env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            states = list(root.glob("*/checkpoint/trainer_state.json"))
            if states and json.loads(states[0].read_text())["step"] >= 10:
                break
            assert proc.poll() is None, proc.stdout.read()
            time.sleep(0.2)
        else:
            raise AssertionError("no checkpoint at step 10 within 120 s")
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out
    started = [p for p in root.iterdir() if (p / "summary.json").exists()]
    assert len(started) == 1, out  # one CPU: one run at a time
    summary = read_summary(started[0])
    ckpt = json.loads((started[0] / "checkpoint" / "trainer_state.json").read_text())
    assert summary["outcome"] == "interrupted", summary
    assert summary["step"] == ckpt["step"] >= 10
    assert summary["train_loss"] > 0 and summary["best_val_loss"] > 0
    row = next(r for r in collect(root).rows if r["run_id"] == started[0].name)
    assert row["outcome"] == "interrupted" and row["step"] == ckpt["step"]
    assert row["train_loss"] == summary["train_loss"]


def test_a_tiny_study_trains_on_the_cluster(cluster, tmp_path):
    """`normlab study --executor ray --address HOST:PORT`: the study's runs go to the cluster."""
    out = tmp_path / "study"
    r = subprocess.run(
        [sys.executable, "-m", "normlab", "study", "--profile", "tiny", "--claims", "C9",
         "--executor", "ray", "--address", cluster.address, "--no-report", "--out", str(out)],
        env=cluster.env(), capture_output=True, text=True, timeout=300)
    log = r.stdout + r.stderr
    assert r.returncode == 0, log[-3000:]
    assert "ray, cpu)" in log  # "training N run(s) ... (... workers, ray, cpu)"
    study = json.loads((out / "study.json").read_text())
    assert [c["id"] for c in study["claims"]] == ["C9"]
    assert study["claims"][0]["verdict"] in ("supported", "not supported", "inconclusive")
    summaries = [read_summary(p) for p in (out / "runs").iterdir() if p.is_dir()]
    assert summaries and all(s["outcome"] in ("completed", "stalled") for s in summaries)
