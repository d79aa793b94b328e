"""One live owner per output folder (infra/lease.py): refused while the owner lives, taken
over once it is provably gone, and an owner whose folder was taken stops writing."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from infra import lease
from infra.lease import (
    LeaseLost,
    OutputInUse,
    Owner,
    acquire,
    check_owned,
    held_lease,
    in_use_problem,
    read_owner,
    this_process,
)
from infra.processes import start_ticks


def write_owner(folder: Path, owner: Owner) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / lease.LEASE).write_text(json.dumps(asdict(owner)))


def live_child() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def owner_of(proc: subprocess.Popen[bytes], host: str | None = None) -> Owner:
    now = time.time()
    return Owner(host or socket.gethostname(), proc.pid, start_ticks(proc.pid), "other-run",
                 now - 5, now - 5)


def test_a_live_owner_on_this_host_is_named_in_the_refusal(tmp_path: Path) -> None:
    child = live_child()
    try:
        write_owner(tmp_path, owner_of(child))
        with pytest.raises(OutputInUse, match=rf"in use by a live run \(flow run 'other-run', "
                                              rf"pid {child.pid} on .*--force-takeover"):
            acquire(tmp_path)
        assert in_use_problem(tmp_path) is not None
    finally:
        child.kill()
        child.wait()


def test_a_dead_owner_on_this_host_is_taken_over_at_once(tmp_path: Path) -> None:
    child = live_child()
    gone = owner_of(child)
    child.kill()
    child.wait()
    write_owner(tmp_path, gone)
    assert in_use_problem(tmp_path) is None
    assert acquire(tmp_path) is True
    held = read_owner(tmp_path)
    assert held is not None and held.same_process(this_process())


def test_a_pid_reused_by_another_process_is_not_the_owner(tmp_path: Path) -> None:
    me = this_process()
    write_owner(tmp_path, replace(me, start_ticks=(me.start_ticks or 0) + 1, flow_run="old"))
    assert acquire(tmp_path) is True


def test_an_owner_on_another_host_lives_until_its_renewals_lapse(tmp_path: Path) -> None:
    now = time.time()
    elsewhere = Owner("node-17", 4242, 1, "remote", now - 600, now - 10)
    write_owner(tmp_path, elsewhere)
    with pytest.raises(OutputInUse, match="pid 4242 on node-17"):
        acquire(tmp_path)
    write_owner(tmp_path, replace(elsewhere, renewed_at=now - lease.LAPSE_S - 1))
    assert acquire(tmp_path) is True


def test_force_takes_it_from_a_live_owner_who_then_stops_at_its_next_commit(
        tmp_path: Path) -> None:
    with held_lease(tmp_path, "first"):
        check_owned(tmp_path)
        now = time.time()
        write_owner(tmp_path, Owner("node-2", 7, 1, "operator's", now, now))  # --force-takeover
        with pytest.raises(LeaseLost, match="now held by flow run \"operator's\", pid 7"):
            check_owned(tmp_path)
    assert read_owner(tmp_path) is not None  # the old owner's exit leaves the new lease


def test_force_takeover_replaces_a_live_owner(tmp_path: Path) -> None:
    child = live_child()
    try:
        write_owner(tmp_path, owner_of(child))
        assert acquire(tmp_path, force=True) is True
        held = read_owner(tmp_path)
        assert held is not None and held.pid != child.pid
    finally:
        child.kill()
        child.wait()


def test_the_lease_is_renewed_while_held_and_removed_after(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lease, "RENEW_S", 0.05)
    with held_lease(tmp_path, "mine"):
        first = read_owner(tmp_path)
        time.sleep(0.3)
        later = read_owner(tmp_path)
        assert first is not None and later is not None and later.renewed_at > first.renewed_at
        with held_lease(tmp_path, "nested"):  # the same process again: no second lease
            pass
        assert read_owner(tmp_path) is not None
    assert read_owner(tmp_path) is None


def test_a_half_written_lease_is_no_owner(tmp_path: Path) -> None:
    (tmp_path / lease.LEASE).write_text('{"host": "x", "pi')
    assert read_owner(tmp_path) is None
    assert acquire(tmp_path) is True


def test_status_names_a_dead_owner_and_says_the_next_run_takes_over(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from expansion.cli import app

    child = live_child()
    gone = owner_of(child)
    child.kill()
    child.wait()
    (tmp_path / "plan.json").write_text(json.dumps({
        "input_path": "p.jsonl", "input_rows": 10, "ids_sha256": "x", "shard_size": 10,
        "num_shards": 1}))
    write_owner(tmp_path, gone)
    shown = CliRunner().invoke(app, ["status", str(tmp_path)])
    assert shown.exit_code == 0, shown.output
    assert f"owner: flow run 'other-run', pid {child.pid} on " in shown.output
    assert "gone (its lease is stale: the next run takes it over)" in shown.output
