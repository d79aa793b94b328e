"""One live owner per output: the run that generates into it.

Two runs on one output (a scheduled deployment run beside a CLI run, a deployment run
twice, two hosts given one bucket prefix) would each take the other's live servers for a
dead run's leftovers and stop them, and write the same shards. So a run first takes the
output's lease, `lease.json`: who owns it (host, pid and the pid's start time, flow run),
since when, and when it last said it is alive. The owner renews it every RENEW_S while it
runs and removes it when it ends.

A second run refuses, naming the owner, while the owner lives. It takes the lease over
when the owner is provably gone — on this host, its pid is dead or now another process; on
another host, it has not renewed for LAPSE_S — or when the operator says so
(`--force-takeover`). An owner whose lease was taken from it finds out at its next commit
(`check_owned`) and stops without writing. Only after the lease is taken does a run stop
servers an earlier run left (tasks/local_servers.py).

Where the lease lives is a `LeaseStore`: the local folder (`FolderLease`, here) and, for a
bucket the job publishes to, the bucket prefix itself (infra/bucket_lease.py), so that runs
on different hosts see one another. Each store's writes are ones only one of two racing runs
can win: an exclusive link in a folder, a conditional put in a bucket.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from infra.files import atomic_write
from infra.processes import start_ticks
from infra.storage import StorageError

LEASE = "lease.json"
RENEW_S = 30.0
LAPSE_S = 120.0  # an owner on another host that has not renewed for this long is gone


class OutputInUse(ValueError):
    """Another live run owns the output."""


class LeaseLost(RuntimeError):
    """This run's lease was taken over (`--force-takeover` elsewhere): it must not write."""


class StoreUnreachable(OSError):
    """The lease's store did not answer this time (a bucket's endpoint): try again later."""


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

    def alive(self, age_s: float) -> bool:
        """Provably running: on this host by its pid, elsewhere by a renewal `age_s` ago."""
        if self.host != socket.gethostname():
            return age_s < LAPSE_S
        return start_ticks(self.pid) == self.start_ticks and self.start_ticks is not None

    def describe(self, age_s: float) -> str:
        since = datetime.fromtimestamp(self.started_at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        run = f"flow run {self.flow_run!r}, " if self.flow_run else ""
        return (f"{run}pid {self.pid} on {self.host}, since {since}, last renewed "
                f"{age_s:.0f} s ago")


@dataclass(frozen=True)
class Found:
    """A lease as read: its owner, the store's version of it (what a conditional write
    names) and the seconds since its last renewal by the store's own clock."""

    owner: Owner
    version: str
    age_s: float

    @property
    def alive(self) -> bool:
        return self.owner.alive(self.age_s)

    def describe(self) -> str:
        return self.owner.describe(self.age_s)


class LeaseStore(Protocol):
    """Where one output's lease lives."""

    @property
    def label(self) -> str: ...

    def read(self) -> Found | None:
        """The lease, or None for none (an unreadable one is none: a run died writing it)."""

    def create(self, owner: Owner) -> bool:
        """Write the lease only if there is none; True if this call wrote it."""

    def take(self, found: Found | None, owner: Owner) -> bool:
        """Replace a dead, overridden or unreadable (None) lease, only if it is still the
        one read."""

    def renew(self, found: Found, owner: Owner) -> Found | None:
        """Rewrite this process's lease; None when it is no longer this process's."""

    def remove(self, found: Found) -> None: ...


def owner_from_json(text: str | bytes) -> Owner | None:
    try:
        return Owner(**json.loads(text))
    except (ValueError, TypeError):
        return None


def owner_json(owner: Owner) -> bytes:
    return (json.dumps(asdict(owner)) + "\n").encode()


@dataclass(frozen=True)
class FolderLease:
    """The lease as `lease.json` in a local (or shared) folder; the clock is this host's."""

    folder: Path

    @property
    def label(self) -> str:
        return str(self.folder)

    def read(self) -> Found | None:
        try:
            owner = owner_from_json((self.folder / LEASE).read_text())
        except OSError:
            return None
        return None if owner is None else Found(owner, "", time.time() - owner.renewed_at)

    def create(self, owner: Owner) -> bool:
        """Exclusive: link(2) fails when the name exists."""
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = self.folder / f".{LEASE}.{owner.pid}.tmp"
        tmp.write_bytes(owner_json(owner))
        try:
            os.link(tmp, self.folder / LEASE)
            return True
        except FileExistsError:
            return False
        finally:
            tmp.unlink(missing_ok=True)

    def take(self, found: Found | None, owner: Owner) -> bool:
        """Rename the old file away first: of two takers only one can."""
        aside = self.folder / f".{LEASE}.taken-{owner.pid}"
        try:
            os.rename(self.folder / LEASE, aside)
        except FileNotFoundError:
            return False
        aside.unlink()
        return self.create(owner)

    def renew(self, found: Found, owner: Owner) -> Found | None:
        now = self.read()
        if now is None or not now.owner.same_process(owner):
            return None
        atomic_write(self.folder / LEASE, owner_json(owner))
        return Found(owner, "", 0.0)

    def remove(self, found: Found) -> None:
        (self.folder / LEASE).unlink(missing_ok=True)


def store_of(where: Path | LeaseStore) -> LeaseStore:
    return FolderLease(where) if isinstance(where, Path) else where


def this_process(flow_run: str = "") -> Owner:
    now = time.time()
    return Owner(socket.gethostname(), os.getpid(), start_ticks(os.getpid()), flow_run, now,
                 now)


def read_owner(where: Path | LeaseStore) -> Owner | None:
    found = store_of(where).read()
    return None if found is None else found.owner


def acquire(where: Path | LeaseStore, flow_run: str = "", force: bool = False) -> bool:
    """Take the output's lease for this process: True when this call took it, False when
    this process held it already; OutputInUse naming a live owner otherwise."""
    store, me = store_of(where), this_process(flow_run)
    for _ in range(3):  # a takeover races at most another taker
        if store.create(me):
            return True
        held = store.read()
        if held is None:  # unreadable (its writer died mid-write), or gone since create
            if store.take(None, me):
                return True
            continue
        if held.owner.same_process(me):
            return False  # a flow run inside another of this process, on the same output
        if held.alive and not force:
            raise OutputInUse(_in_use(store, held))
        if store.take(held, me):
            return True
    raise OutputInUse(f"output: {store.label}: another run took the lease at the same "
                      "moment; run again to see which")


def in_use_problem(where: Path | LeaseStore) -> str | None:
    """The refusal acquire() would give now, checked before anything starts; None if free."""
    store = store_of(where)
    held = store.read()
    if held is None or held.owner.same_process(this_process()) or not held.alive:
        return None
    return _in_use(store, held)


def _in_use(store: LeaseStore, held: Found) -> str:
    return (f"output: {store.label} is in use by a live run ({held.describe()}); wait "
            "for it to end, use another output, or pass --force-takeover if you know that "
            "run is dead")


class _Renewal:
    """A held lease and the daemon thread that renews it; `lost` says by whom it was taken."""

    def __init__(self, store: LeaseStore) -> None:
        self.store, self.lost = store, ""
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"lease {store.label}",
                                       daemon=True)

    def _run(self) -> None:
        found = self.store.read()
        while found is not None and not self.done.wait(RENEW_S):
            owner = replace(found.owner, renewed_at=time.time())
            try:
                found = self.store.renew(found, owner)
            except OSError:  # StoreUnreachable among them: the next renewal tries again
                continue
        if found is None:
            now = self.store.read()
            self.lost = now.describe() if now else "nobody (the lease is gone)"

    def stop(self) -> None:
        """End the renewals and remove the lease; a store out of reach keeps it (it lapses,
        and a run on this host takes it over at once, its pid gone) rather than hide the
        error that ends the run behind its own."""
        self.done.set()
        self.thread.join(timeout=5)
        with contextlib.suppress(OSError, StorageError):
            held = self.store.read()
            if held is not None and held.owner.same_process(this_process()):
                self.store.remove(held)


_HELD: dict[str, list[_Renewal]] = {}  # local folder → the leases its run holds beside it


def check_owned(folder: Path) -> None:
    """Raise LeaseLost unless this process still holds the folder's lease (read now) and
    every lease held beside it (as their last renewal found them)."""
    held = FolderLease(folder).read()
    if held is None or not held.owner.same_process(this_process()):
        who = held.describe() if held else "nobody (the lease file is gone)"
        raise LeaseLost(f"output: {folder}: this run's lease is now held by {who}; it stops "
                        "without writing more")
    for renewal in _HELD.get(str(folder), []):
        if renewal.lost:
            raise LeaseLost(f"output: {renewal.store.label}: this run's lease is now held by "
                            f"{renewal.lost}; it stops without writing more")


def release(where: Path | LeaseStore) -> None:
    """Remove the lease if this process holds it."""
    store = store_of(where)
    held = store.read()
    if held is not None and held.owner.same_process(this_process()):
        store.remove(held)


@contextlib.contextmanager
def held_lease(folder: Path, flow_run: str = "", force: bool = False,
               beside: Sequence[LeaseStore] = ()) -> Iterator[None]:
    """The folder's lease and those `beside` it (the bucket the run publishes to) for the
    body's length, each renewed every RENEW_S (left alone where an outer body of this
    process holds it)."""
    renewals: list[_Renewal] = []
    try:
        for store in [FolderLease(folder), *beside]:
            if acquire(store, flow_run, force):
                renewals.append(_Renewal(store))
                renewals[-1].thread.start()
        partners = [r for r in renewals if r.store.label != str(folder)]
        _HELD[str(folder)] = _HELD.get(str(folder), []) + partners
        yield
    finally:
        for renewal in reversed(renewals):
            renewal.stop()
        left = [r for r in _HELD.pop(str(folder), []) if r not in renewals]
        if left:
            _HELD[str(folder)] = left
