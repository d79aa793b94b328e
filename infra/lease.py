"""One live owner per output folder: the run that generates into it.

Two runs on one folder (a scheduled deployment run beside a CLI run, a deployment run
twice) would each take the other's live servers for a dead run's leftovers and stop them,
and write the same shards. So a run first takes the folder's lease, `lease.json`: who owns
it (host, pid and the pid's start time, flow run), since when, and when it last said it is
alive. The owner renews it every RENEW_S while it runs and removes it when it ends.

A second run refuses, naming the owner, while the owner lives. It takes the lease over
when the owner is provably gone — on this host, its pid is dead or now another process; on
another host, it has not renewed for LAPSE_S — or when the operator says so
(`--force-takeover`). An owner whose lease was taken from it finds out at its next commit
(`check_owned`) and stops without writing. Only after the lease is taken does a run stop
servers an earlier run left (tasks/local_servers.py).

The file is created with an exclusive link, so of two runs that start at once exactly one
gets it; a takeover renames the dead owner's file away first, which only one taker can do.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from infra.files import atomic_write
from infra.processes import start_ticks

LEASE = "lease.json"
RENEW_S = 30.0
LAPSE_S = 120.0  # an owner on another host that has not renewed for this long is gone


class OutputInUse(ValueError):
    """Another live run owns the output folder."""


class LeaseLost(RuntimeError):
    """This run's lease was taken over (`--force-takeover` elsewhere): it must not write."""


@dataclass(frozen=True)
class Owner:
    host: str
    pid: int
    start_ticks: int | None
    flow_run: str
    started_at: float
    renewed_at: float

    def same_process(self, other: Owner) -> bool:
        return (self.host, self.pid, self.start_ticks) == (other.host, other.pid,
                                                           other.start_ticks)

    def alive(self, now: float) -> bool:
        """Provably running: on this host by its pid, elsewhere by a recent renewal."""
        if self.host != socket.gethostname():
            return now - self.renewed_at < LAPSE_S
        return start_ticks(self.pid) == self.start_ticks and self.start_ticks is not None

    def describe(self, now: float) -> str:
        since = datetime.fromtimestamp(self.started_at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        run = f"flow run {self.flow_run!r}, " if self.flow_run else ""
        return (f"{run}pid {self.pid} on {self.host}, since {since}, last renewed "
                f"{now - self.renewed_at:.0f} s ago")


def this_process(flow_run: str = "") -> Owner:
    now = time.time()
    return Owner(socket.gethostname(), os.getpid(), start_ticks(os.getpid()), flow_run, now,
                 now)


def read_owner(folder: Path) -> Owner | None:
    """The lease's owner, or None for no lease (an unreadable one is no owner: it was being
    written by a run that died mid-write)."""
    try:
        return Owner(**json.loads((folder / LEASE).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def _create(folder: Path, owner: Owner) -> bool:
    """Create the lease file only if there is none (link(2) is exclusive)."""
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{LEASE}.{owner.pid}.tmp"
    tmp.write_text(json.dumps(asdict(owner)) + "\n")
    try:
        os.link(tmp, folder / LEASE)
        return True
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)


def acquire(folder: Path, flow_run: str = "", force: bool = False) -> bool:
    """Take the folder's lease for this process: True when this call took it, False when
    this process held it already; OutputInUse naming a live owner otherwise."""
    me = this_process(flow_run)
    for _ in range(3):  # a takeover races at most another taker
        if _create(folder, me):
            return True
        held = read_owner(folder)
        if held is not None and held.same_process(me):
            return False  # a flow run inside another of this process, on the same folder
        if held is not None and held.alive(time.time()) and not force:
            raise OutputInUse(_in_use(folder, held))
        with contextlib.suppress(FileNotFoundError):  # only one taker renames it away
            os.rename(folder / LEASE, folder / f".{LEASE}.taken-{me.pid}")
            (folder / f".{LEASE}.taken-{me.pid}").unlink()
    raise OutputInUse(f"output: {folder}: another run took the lease at the same moment; "
                      "run again to see which")


def in_use_problem(folder: Path) -> str | None:
    """The refusal acquire() would give now, checked before anything starts; None if free."""
    held = read_owner(folder)
    me = this_process()
    if held is None or held.same_process(me) or not held.alive(time.time()):
        return None
    return _in_use(folder, held)


def _in_use(folder: Path, held: Owner) -> str:
    return (f"output: {folder} is in use by a live run ({held.describe(time.time())}); wait "
            "for it to end, use another output, or pass --force-takeover if you know that "
            "run is dead")


def check_owned(folder: Path) -> None:
    """Raise LeaseLost unless this process still holds the folder's lease."""
    held = read_owner(folder)
    if held is None or not held.same_process(this_process()):
        now = time.time()
        who = held.describe(now) if held else "nobody (the lease file is gone)"
        raise LeaseLost(f"output: {folder}: this run's lease is now held by {who}; it stops "
                        "without writing more")


def release(folder: Path) -> None:
    """Remove the lease if this process holds it."""
    held = read_owner(folder)
    if held is not None and held.same_process(this_process()):
        (folder / LEASE).unlink(missing_ok=True)


@contextlib.contextmanager
def held_lease(folder: Path, flow_run: str = "", force: bool = False) -> Iterator[None]:
    """The lease for the body's length, renewed every RENEW_S by a daemon thread (and left
    alone when an outer body of this process holds it)."""
    if not acquire(folder, flow_run, force):
        yield
        return
    me = this_process()
    done = threading.Event()

    def renew() -> None:
        while not done.wait(RENEW_S):
            held = read_owner(folder)
            if held is None or not held.same_process(me):
                return  # taken over: the next commit's check_owned stops the run
            atomic_write(folder / LEASE, (json.dumps(
                asdict(held) | {"renewed_at": time.time()}) + "\n").encode())

    thread = threading.Thread(target=renew, name="output-lease", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=5)
        release(folder)
