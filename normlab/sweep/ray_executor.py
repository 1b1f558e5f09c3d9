"""The Ray executor: one Ray task per run (`num_cpus=threads`, one GPU each on GPU runs, a stacked
group's runs separately), at most `workers` in flight, on a local instance (started and stopped
here) or on a cluster at an address. The sweep root must be on a file system every node sees.
Ctrl-C asks the tasks to checkpoint and stop, and kills those that do not within
`RAY_STOP_GRACE_S`; a killed run's summary records the step and losses of its last checkpoint
(`normlab.sweep.unfinished`).

Token authentication. Ray (2.52 and later) can require a shared token on every connection to a
cluster (`RAY_AUTH_MODE=token`). Since Ray 2.59, `ray.init()` without an address starts a local
instance with token authentication on and writes a token to `~/.ray/auth_token` when there is
none, and `ray start --head` turns token authentication on whenever it finds a token there. A
driver that connects to an explicit `host:port`, though, looks for a token only when its own
`RAY_AUTH_MODE` is `token` (`address="auto"` does look), so a head started on a machine where
any local Ray instance once ran refused it (`InvalidAuthToken`, retried for about 20 s).

`ray_session` therefore does what `ray.init(address="auto")` does, for any address: when
`RAY_AUTH_MODE` is not set and a token is available where Ray reads one (`RAY_AUTH_TOKEN`, the
file named by `RAY_AUTH_TOKEN_PATH`, then `~/.ray/auth_token`), it connects with token
authentication on. A cluster without authentication ignores the token (checked with ray 2.60). A
`host:port` address is checked first, in well under a second: nothing listening there, or a
cluster that refuses this process's token, is one error that says what to do.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from normlab.sweep.executors import AnyTask, ExecutorError, OnFinish, OnStart, run_one, runs_of
from normlab.sweep.grouping import RunTask
from normlab.sweep.unfinished import record_interrupted
from normlab.train.trainer import record_failure

MODE_ENV = "RAY_AUTH_MODE"
TOKEN_ENV = "RAY_AUTH_TOKEN"
TOKEN_PATH_ENV = "RAY_AUTH_TOKEN_PATH"
HOW_TO_FIX = (
    "give this process the cluster's token (`ray get-auth-token` on the head node prints it): "
    f"put it in ~/.ray/auth_token, or set {TOKEN_ENV}=<token> or {TOKEN_PATH_ENV}=<file>; "
    "see docs/sweeps.md, 'Ray clusters and tokens'")


def default_token_path() -> Path:
    """Where Ray keeps a machine's token unless told otherwise."""
    return Path.home() / ".ray" / "auth_token"


def token_source(environ: dict[str, str] | None = None) -> str | None:
    """Where Ray would read this process's token from, in Ray's order of precedence (None: no
    token anywhere). A `RAY_AUTH_TOKEN_PATH` naming a missing or empty file is an error here:
    Ray itself aborts the process on it."""
    env = os.environ if environ is None else environ
    if env.get(TOKEN_ENV, "").strip():
        return f"the environment variable {TOKEN_ENV}"
    if env.get(TOKEN_PATH_ENV):
        path = Path(env[TOKEN_PATH_ENV]).expanduser()
        try:
            ok = bool(path.read_text().strip())
        except OSError as e:
            raise ExecutorError(f"{TOKEN_PATH_ENV}={path}: cannot read the token file "
                                f"({e.strerror}); {HOW_TO_FIX}") from None
        if not ok:
            raise ExecutorError(f"{TOKEN_PATH_ENV}={path}: the token file is empty; {HOW_TO_FIX}")
        return f"the file {path} ({TOKEN_PATH_ENV})"
    path = default_token_path()
    with contextlib.suppress(OSError):
        if path.read_text().strip():
            return f"the file {path}"
    return None


def _refresh_ray_config() -> None:
    """Ray's C++ side reads RAY_AUTH_MODE once; have it read the environment again (what Ray's
    own `ray.init(address="auto")` does after turning token mode on)."""
    with contextlib.suppress(ImportError, AttributeError):
        from ray._raylet import Config

        Config.initialize("")


@contextlib.contextmanager
def token_auth(address: str | None) -> Iterator[str | None]:
    """For the time of a connection to `address`: token mode on when RAY_AUTH_MODE is unset and a
    token is available. Yields where the token comes from (None: connecting without one).
    Nothing changes for a local instance (`address` None: Ray decides) or when RAY_AUTH_MODE is
    set (the user decided)."""
    mode = os.environ.get(MODE_ENV)
    if address is None:
        yield None
        return
    if mode is not None:
        yield token_source() if mode.lower() == "token" else None
        return
    source = token_source()
    if source is None:
        yield None
        return
    os.environ[MODE_ENV] = "token"
    _refresh_ray_config()
    try:
        yield source
    finally:
        os.environ.pop(MODE_ENV, None)
        _refresh_ray_config()


def _host_port(address: str) -> tuple[str, int] | None:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or "://" in address:
        return None  # auto, ray://...: Ray resolves those
    return host.strip("[]"), int(port)


def check_cluster(address: str, token_from: str | None, timeout_s: float = 10.0) -> None:
    """Fail fast, with what to do, when nothing listens at a `host:port` address or the cluster
    there refuses this process's token (ray.init would retry each for 20 s or more)."""
    hp = _host_port(address)
    if hp is None:
        return
    try:
        socket.create_connection(hp, timeout=timeout_s).close()
    except OSError as e:
        raise ExecutorError(
            f"cannot reach the Ray cluster at {address}: {e.strerror or e}; is its head node up "
            f"(`ray start --head --port {hp[1]}`) and the port open from here?") from None
    try:
        from ray._raylet import GcsClient
        from ray.exceptions import AuthenticationError
    except ImportError:  # a Ray without token authentication: nothing more to check
        return
    try:
        GcsClient(address=address)
    except AuthenticationError:
        raise ExecutorError(auth_error_message(address, token_from)) from None
    except Exception:  # anything else is reported by ray.init, in Ray's words
        return


def auth_error_message(address: str, token_from: str | None) -> str:
    mode = os.environ.get(MODE_ENV)
    if token_from is not None:
        why = f"refused the token from {token_from}: it is not this cluster's token;"
    elif mode is not None and mode.lower() != "token":
        why = (f"requires token authentication, and this process has {MODE_ENV}={mode}: unset "
               "it, and")
    else:
        why = "requires token authentication, and this process has no token;"
    return f"the Ray cluster at {address} {why} {HOW_TO_FIX}"


@contextlib.contextmanager
def ray_session(address: str | None, num_cpus: int) -> Iterator[Any]:
    """The `ray` module, connected: to the cluster at `address`, or (None) to a new local instance
    with `num_cpus` CPUs (no dashboard, bound to 127.0.0.1, usage statistics off), shut down and
    token mode restored on exit. A process already connected to Ray stays as it is."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    try:
        import ray
    except ImportError:
        raise ExecutorError("the ray executor needs the package ray: pip install 'ray>=2.9'"
                            ) from None
    if ray.is_initialized():
        yield ray
        return
    kwargs: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.WARNING}
    with token_auth(address) as token_from:  # on for the whole connection, not just its start
        if address:
            check_cluster(address, token_from)
            kwargs["address"] = address
        else:
            kwargs.update(num_cpus=num_cpus, include_dashboard=False,
                          _node_ip_address="127.0.0.1")
        try:
            ray.init(**kwargs)
        except Exception as e:
            where = f"the Ray cluster at {address}" if address else "a local Ray instance"
            raise ExecutorError(f"cannot start or reach {where}: {type(e).__name__}: {e}"
                                ) from None
        try:
            yield ray
        finally:
            ray.shutdown()


# -- the executor ------------------------------------------------------------------------------

RAY_STOP_GRACE_S = 30.0  # after Ctrl-C: how long runs get to checkpoint before they are killed


def run_ray(tasks: list[AnyTask], root: Path, *, workers: int | None, threads: int,
            address: str | None, on_start: OnStart, on_finish: OnFinish) -> None:
    """Run every run as a Ray task (a stacked group's runs separately). `address=None` starts
    (and stops) a local Ray instance with `workers * threads` CPUs; with an address, `workers`
    caps the runs in flight (default: as many as the cluster's CPUs allow)."""
    tasks = [run for task in tasks for run in runs_of(task)]
    in_flight: dict[Any, RunTask] = {}
    with ray_session(address, num_cpus=(workers or 1) * threads) as ray:
        gpus = ray.cluster_resources().get("GPU", 0)
        if workers is None:
            workers = max(1, int(ray.cluster_resources().get("CPU", 1) // threads))
        remote = ray.remote(run_one)
        pending = deque(tasks)
        try:
            while pending or in_flight:
                while pending and len(in_flight) < workers:
                    task = pending.popleft()
                    use_gpu = gpus > 0 and task.config["train"]["device"] in ("auto", "cuda")
                    ref = remote.options(num_cpus=threads, num_gpus=1 if use_gpu else 0,
                                         max_retries=1).remote(task.config, str(root), threads,
                                                               task.run_id)
                    in_flight[ref] = task
                    on_start(task.run_id)
                done, _ = ray.wait(list(in_flight), num_returns=1, timeout=1.0)
                for ref in done:
                    task = in_flight.pop(ref)
                    try:
                        summary, wall = ray.get(ref)
                    except Exception as e:  # the worker died twice, or the task could not run
                        summary, wall = record_failure(root / task.run_id, task.run_id,
                                                       "worker_died", f"{type(e).__name__}: {e}"
                                                       ), 0.0
                    on_finish(task.run_id, summary, wall)
        except KeyboardInterrupt:
            _stop_ray(ray, in_flight, root, on_finish)
            raise


def _stop_ray(ray: Any, in_flight: dict[Any, RunTask], root: Path, on_finish: OnFinish,
              grace_s: float = RAY_STOP_GRACE_S) -> None:
    """Ctrl-C: ask every running run to stop (Ray raises KeyboardInterrupt in the task, which
    `train_run` takes as a signal: it checkpoints and writes `interrupted` at its step), wait up
    to `grace_s` (a second Ctrl-C: no more), then kill what is left. A killed run's summary gets
    the step of its last checkpoint and its losses up to it (`record_interrupted`)."""
    for ref in in_flight:
        ray.cancel(ref)
    deadline = time.monotonic() + grace_s
    with contextlib.suppress(KeyboardInterrupt):
        while in_flight and time.monotonic() < deadline:
            done, _ = ray.wait(list(in_flight), num_returns=1, timeout=1.0)
            for ref in done:
                task = in_flight.pop(ref)
                _report_stopped(root, task, "signal", on_finish)
    for ref in in_flight:
        ray.cancel(ref, force=True)  # its run resumes from its last checkpoint
    for task in in_flight.values():
        _report_stopped(root, task, "killed", on_finish)


def _report_stopped(root: Path, task: RunTask, reason: str, on_finish: OnFinish) -> None:
    summary = record_interrupted(root / task.run_id, task.run_id, reason)
    if summary["outcome"] != "pending":
        on_finish(task.run_id, summary, 0.0)
