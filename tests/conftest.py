"""Shared fixtures: free ports per xdist worker, simulated fleets, the run's Prefect API; the
run's end checks that no process the tests started is still alive (tests/session.py)."""

from __future__ import annotations

import contextlib
import itertools
import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from infra.processes import port_is_free
from infra.settings import JobSettings, load_settings
from tasks.engines import build_engine
from tasks.health import wait_until_healthy
from tasks.local_servers import ServerHandle, launch_fleet, registry_for, stop_fleet
from tests import session as run_session

# Data the tests read, kept in the repository: a plain clone has nothing beside it.
FIXTURES = Path(__file__).resolve().parent / "fixtures"
_counter = itertools.count()


def _worker_index() -> int:
    name = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(name.removeprefix("gw") or 0)


def free_port_block(size: int) -> int:
    """A base port with `size` consecutive free ports, distinct per xdist worker."""
    for _ in range(200):
        # Below the kernel's ephemeral range (32768+), where client sockets take local ports.
        base = 20000 + _worker_index() * 4000 + (next(_counter) * 16) % 3900
        if all(port_is_free("127.0.0.1", base + i) for i in range(size)):
            return base
    raise RuntimeError("no free port block")


@pytest.fixture
def ports() -> Callable[[int], int]:
    return free_port_block


def sim_settings(tmp_path: Path, n: int = 2, **overrides: Any) -> JobSettings:
    values: dict[str, Any] = {
        "engine": "sim", "gpus": list(range(n)), "output": str(tmp_path / "out"),
        "base_port": free_port_block(n), "sim.startup_s": 0.2, "sim.time_scale": 500.0,
        "stop_grace_s": 5.0, "startup_timeout_s": 60.0, "sampling.max_new_tokens": 32,
    }
    values.update(overrides)
    return load_settings(None, **values)


@pytest.fixture
def sim_fleet(tmp_path: Path) -> Iterator[Callable[..., list[ServerHandle]]]:
    """Start simulated servers through the real launch path; always stop them."""
    started: list[tuple[list[ServerHandle], Path]] = []

    def start(n: int = 2, wait: bool = True, **overrides: Any) -> list[ServerHandle]:
        settings = sim_settings(tmp_path, n, **overrides)
        out = Path(settings.output)
        handles = launch_fleet(build_engine(settings).launch_specs(settings.server, out),
                               registry_for(out),
                               settings.server.fingerprint(), 5.0)
        started.append((handles, out))
        if wait:
            key = settings.api_key.get_secret_value() if settings.api_key else None
            wait_until_healthy(handles, key, 60.0)
        return handles

    yield start
    for handles, out in started:
        stop_fleet(handles, registry_for(out), 5.0)


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist)
        run_session.mark_run()


@pytest.hookimpl(trylast=True)  # after xdist has torn its workers down
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if hasattr(session.config, "workerinput"):
        return
    import time

    run_session.stop_shared_prefect()
    from infra.sim.replay_worker import WORKER  # in-process flows score moves through it

    WORKER.stop()
    deadline = time.monotonic() + 45  # workers' fixture teardowns (a Prefect worker: ≤ 20 s)
    left = run_session.leftover_processes()
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = run_session.leftover_processes()
    if left:
        run_session.kill_leftovers(left)
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        lines = "\n".join(f"  {line}" for line in left)
        if reporter is not None:
            reporter.write_line(f"processes the tests started are still alive (killed):\n{lines}",
                                red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session")
def prefect_env() -> dict[str, str]:
    """The run's one Prefect server (tests/session.py), exported to this worker's
    environment so that every CLI subprocess a test starts talks to it too."""
    from infra.prefect_env import configure_local_prefect

    configure_local_prefect()
    env = run_session.shared_prefect_env(free_port_block(1))
    os.environ.update(env)
    return env


@pytest.fixture(scope="session")
def prefect_api(prefect_env: dict[str, str]) -> Iterator[None]:
    """In-process flows run against the run's Prefect server."""
    from prefect.settings import PREFECT_API_URL, PREFECT_HOME, temporary_settings

    with temporary_settings({PREFECT_API_URL: prefect_env["PREFECT_API_URL"],
                             PREFECT_HOME: prefect_env["PREFECT_HOME"]}):
        yield


def socket_closed(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


@pytest.fixture(scope="session")
def s3_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """moto's request log (one line per request, with its status): what a test that saw an
    unexpected S3 answer prints to say which request got it."""
    return tmp_path_factory.getbasetemp() / "moto.log"


@pytest.fixture(scope="session")
def s3_endpoint(s3_log: Path) -> Iterator[str]:
    """A real S3 server (moto's server mode) on 127.0.0.1, with test credentials."""
    import subprocess
    import sys
    import time

    import httpx

    port = free_port_block(1)
    exe = Path(sys.executable).parent / "moto_server"
    log = open(s3_log, "wb")  # noqa: SIM115 - closed after the server stops
    proc = subprocess.Popen([str(exe), "-H", "127.0.0.1", "-p", str(port)],
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(url, timeout=1).status_code == 200:  # moto lists buckets on GET /
                break
        except httpx.HTTPError:
            time.sleep(0.2)
    else:
        proc.kill()
        log.close()
        raise RuntimeError(f"moto_server did not start on port {port}: "
                           f"{s3_log.read_text(errors='replace')[-2000:]}")
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()


@pytest.fixture
def bucket(s3_endpoint: str) -> str:
    import uuid

    import boto3

    name = f"b-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1").create_bucket(
        Bucket=name)
    return name


def stop_process_group(proc: Any, first: int, timeout_s: float = 20.0) -> None:
    """Signal a child started with start_new_session=True and everything it spawned; SIGKILL
    the group if it has not exited within `timeout_s`."""
    import signal
    import subprocess

    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, first)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@contextlib.contextmanager
def running_prefect_server(home: Path) -> Iterator[dict[str, str]]:
    """A real `prefect server start` (SQLite) on 127.0.0.1; yields the env to talk to it."""
    import signal
    import subprocess
    import sys
    import time

    import httpx

    port = free_port_block(1)
    run_session.migrated_home(home)
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_API_HOST": "127.0.0.1",
           "PREFECT_SERVER_API_PORT": str(port), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
           "PREFECT_LOGGING_TO_API_BATCH_INTERVAL": "0.5"}
    env.pop("PREFECT_API_KEY", None)
    exe = Path(sys.executable).parent / "prefect"
    log = open(home / "server.log", "wb")  # noqa: SIM115 - closed after the server stops
    proc = subprocess.Popen([str(exe), "server", "start"], env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/api/health",
                             timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None:
                raise RuntimeError((home / "server.log").read_text()[-3000:])
            time.sleep(0.5)
        else:
            raise RuntimeError("prefect server did not become healthy in 180 s")
        yield {k: v for k, v in env.items() if k.startswith("PREFECT_")}
    finally:
        stop_process_group(proc, signal.SIGTERM)
        log.close()


@pytest.fixture(scope="session")
def prefect_server(prefect_env: dict[str, str]) -> dict[str, str]:
    """The Prefect server for the tests that deploy `deployments/prefect.yaml` and start process
    workers on its pools: the run's own. Those tests share one xdist group, so they run one
    at a time (two of them at once would take each other's flow runs from the shared
    pools); nothing else in the suite
    deploys or polls a work pool."""
    return prefect_env
