"""What the whole test run shares, and what it must leave behind: nothing.

* **One Prefect API for the run.** A cold Prefect server costs 15–28 s on two cores (SQLite
  migrations), and a CLI run without `PREFECT_API_URL` boots a temporary one of its own. The
  first xdist worker that needs one starts a real `prefect server start` under a file lock in
  the run's shared folder; the others read its address from there. Every worker exports it,
  so each CLI subprocess a test starts talks to it instead of booting its own. The tests
  whose point is the temporary API (the README block, the killed-run marking) strip it; the
  ones that deploy and start process workers (deployment, fleet) hold the run's work-pool lock
  (`work_pools_held`) while their workers poll, since two of them on one server's pools take
  each other's runs: a node run of the fleet test, taken by the deployment test's worker, went
  to that worker's S3 server and failed "bucket does not exist". Every Prefect home
  the tests make starts from one migrated database (`migrated_home`).
* **No leaks.** The controller marks the run with `EXPANSION_TEST_RUN=<id>` before the workers
  start; every process the tests start inherits it. At the end the controller stops the shared
  server and looks for any process still carrying the mark: it lists them, kills them, and
  fails the run.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx

RUN_MARK = "EXPANSION_TEST_RUN"
SHARED_DIR = "EXPANSION_TEST_SHARED"


def mark_run() -> None:
    """In the controller, before any worker or test process exists."""
    if RUN_MARK not in os.environ:
        os.environ[RUN_MARK] = uuid.uuid4().hex
        os.environ[SHARED_DIR] = tempfile.mkdtemp(prefix="expansion-tests-")


@contextlib.contextmanager
def work_pools_held() -> Iterator[None]:
    """The run's work pools, for one test module's process workers at a time, across xdist
    workers. The xdist group these tests share is not enough: with pytest 9.2, xdist 3.8's
    `--dist loadgroup` silently stops grouping (pytest-dev/pytest-xdist#1386), and in a plain
    `-n 3` run the two modules' workers polled "gpu-local" at once. A lock holds whatever the
    scheduler does; when the group works, nobody waits on it."""
    with open(Path(os.environ[SHARED_DIR]) / "work-pools.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def shared_prefect_env(free_port: int) -> dict[str, str]:
    """The run's Prefect server (started here if no worker has yet): its PREFECT_* env."""
    shared = Path(os.environ[SHARED_DIR])
    record = shared / "prefect.json"
    with open(shared / "prefect.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if record.exists():
            env: dict[str, str] = json.loads(record.read_text())["env"]
            if _healthy(env["PREFECT_API_URL"]):
                return env
        env, pid = _start_server(shared / "prefect-home", free_port)
        record.write_text(json.dumps({"env": env, "pid": pid}))
        return env


def migrated_home(home: Path) -> Path:
    """`home` (made if missing) holding a copy of the run's migrated, empty Prefect database.

    A Prefect server or temporary API on a new SQLite file runs every Alembic migration first:
    19 s of CPU against 10 s on a migrated copy (compiled bytecode, idle box; ~100 s under the
    suite's load). The run migrates one database, once, under the shared folder's lock, and
    every Prefect home the tests make starts from a copy. What a test checks about Prefect is
    unchanged: the same schema, empty, at the version uv.lock pins."""
    shared = Path(os.environ[SHARED_DIR])
    template = shared / "prefect-template"
    with open(shared / "template.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (template / "prefect.db").exists():
            template.mkdir(exist_ok=True)
            env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
            env.update(PREFECT_HOME=str(template), PREFECT_SERVER_ANALYTICS_ENABLED="false")
            exe = Path(sys.executable).parent / "prefect"
            subprocess.run([str(exe), "server", "database", "upgrade", "-y"], env=env,
                           capture_output=True, timeout=600, check=True)
    home.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(template / "prefect.db", home / "prefect.db")
    return home


def _start_server(home: Path, port: int) -> tuple[dict[str, str], int]:
    migrated_home(home)
    url = f"http://127.0.0.1:{port}/api"
    env = {"PREFECT_HOME": str(home), "PREFECT_SERVER_API_HOST": "127.0.0.1",
           "PREFECT_SERVER_API_PORT": str(port), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_API_URL": url, "PREFECT_LOGGING_TO_API_BATCH_INTERVAL": "0.5"}
    full = {k: v for k, v in os.environ.items() if k != "PREFECT_API_KEY"} | env
    exe = Path(sys.executable).parent / "prefect"
    log = open(home / "server.log", "ab")  # noqa: SIM115 - the server outlives this call
    proc = subprocess.Popen([str(exe), "server", "start"], env=full, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 180
    while not _healthy(url):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("the run's Prefect server did not start:\n"
                               + (home / "server.log").read_text()[-3000:])
        time.sleep(0.5)
    return env, proc.pid


def stop_shared_prefect() -> None:
    """In the controller at the end: stop the run's server and its process group."""
    shared = os.environ.get(SHARED_DIR)
    record = Path(shared or "/nonexistent") / "prefect.json"
    if not record.exists():
        return
    pid = json.loads(record.read_text())["pid"]
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + 20
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "zombie" not in _status(pid)


def _status(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().lower()
    except OSError:
        return "zombie"


def leftover_processes() -> list[str]:
    """Every live process, other than this one, that carries this run's mark."""
    mark = f"{RUN_MARK}={os.environ.get(RUN_MARK)}".encode()
    found: list[str] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if mark in environ.split(b"\0") and "zombie" not in _status(int(entry.name)):
            found.append(f"pid {entry.name}: {cmdline.strip()[:160]}")
    return found


def kill_leftovers(lines: list[str]) -> None:
    for line in lines:
        pid = int(line.split()[1].rstrip(":"))
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
