"""Start and stop server processes so none is ever orphaned, and none we did not start is touched.

Four layers keep GPUs from leaking: the child gets PR_SET_PDEATHSIG (dies with its parent),
stays in our process group (a Prefect worker's killpg reaches it), is recorded in a registry
file with its start time (a rerun can find and stop it), and is stopped explicitly on every
exit path of the flow.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from infra.files import atomic_write

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """PR_SET_PDEATHSIG: the child gets SIGTERM when its parent dies (runs between fork and
    exec)."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass(frozen=True)
class ProcessRecord:
    """Enough to find a process again after our own process died, and to be sure it is ours."""

    pid: int
    start_ticks: int  # /proc/<pid>/stat field 22: distinguishes a reused pid
    port: int
    host: str
    log_path: str
    argv: list[str]


def start_ticks(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def spawn(argv: Sequence[str], env: Mapping[str, str], log_path: Path, port: int,
          host: str) -> tuple[subprocess.Popen[bytes], ProcessRecord]:
    """Start a server with its stdout/stderr in `log_path` (argv list, no shell)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            list(argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, **env}, preexec_fn=die_with_parent, close_fds=True,
        )
    ticks = start_ticks(proc.pid) or 0
    return proc, ProcessRecord(proc.pid, ticks, port, host, str(log_path), list(argv))


def is_ours_and_alive(record: ProcessRecord) -> bool:
    """True only if the pid is alive (not a zombie) *and* is the very process we started."""
    return start_ticks(record.pid) == record.start_ticks and is_alive(record.pid)


def is_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still answers kill(0); reap it if it is ours.
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    state = _proc_state(pid)
    return state not in (None, "Z", "X")


def _proc_state(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def terminate(records: Sequence[ProcessRecord], grace_s: float) -> list[int]:
    """SIGTERM every live process of ours, SIGKILL those still alive after the grace period.

    Returns the pids that had to be killed. Processes that are not ours are never signalled.
    """
    live = [r for r in records if is_ours_and_alive(r)]
    for rec in live:
        with contextlib.suppress(ProcessLookupError):
            os.kill(rec.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(is_alive(r.pid) for r in live):
        time.sleep(0.05)
    killed = []
    for rec in live:
        if is_alive(rec.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(rec.pid, signal.SIGKILL)
            killed.append(rec.pid)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(is_alive(r.pid) for r in live):
        time.sleep(0.05)
    return killed


def port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def wait_ports_free(host: str, ports: Sequence[int], timeout_s: float = 10.0) -> list[int]:
    """Ports still busy after the timeout (empty when all are free)."""
    deadline = time.monotonic() + timeout_s
    busy = [p for p in ports if not port_is_free(host, p)]
    while busy and time.monotonic() < deadline:
        time.sleep(0.1)
        busy = [p for p in busy if not port_is_free(host, p)]
    return busy


class ProcessRegistry:
    """A JSON file listing the servers a job started (written atomically)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> list[ProcessRecord]:
        if not self.path.is_file():
            return []
        try:
            rows = json.loads(self.path.read_text())
            return [ProcessRecord(**row) for row in rows]
        except (json.JSONDecodeError, TypeError) as exc:
            raise ValueError(
                f"{self.path}: unreadable server registry ({exc}); stop any servers of this "
                "job by hand, then delete the file") from exc

    def save(self, records: Sequence[ProcessRecord]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(self.path, json.dumps([asdict(r) for r in records], indent=1).encode())

    def add(self, record: ProcessRecord) -> None:
        self.save([*self.load(), record])

    def remove(self, record: ProcessRecord) -> None:
        """Forget one server (stopped alone, by a rolling restart); the others stay listed."""
        self.save([r for r in self.load() if r != record])

    def clear(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


def ephemeral_port_range(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range"),
                         ) -> tuple[int, int] | None:
    """The kernel's range for the local ports of outgoing connections (Linux), if known."""
    try:
        low, high = (int(x) for x in path.read_text().split())
    except (OSError, ValueError):
        return None
    return low, high


def ephemeral_port_warning(ports: Sequence[int], field: str = "base_port",
                           span: tuple[int, int] | None = None) -> str | None:
    """A server port inside the ephemeral range can be taken at any moment by some client's
    outgoing connection, and the server then fails to bind — usually hours into a job, on a
    relaunch. Say so before anything starts."""
    span = span or ephemeral_port_range()
    if span is None or not ports:
        return None
    clash = [p for p in ports if span[0] <= p <= span[1]]
    if not clash:
        return None
    return (f"{field}: server port(s) {clash[0]}–{clash[-1]} lie in the kernel's ephemeral "
            f"range {span[0]}–{span[1]}, where outgoing connections take their local ports; a "
            f"relaunch can then fail to bind. Pick a base_port below {span[0]} (default 30000)")
