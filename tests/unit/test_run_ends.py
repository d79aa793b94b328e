"""The ends of a failed run as the user reads them (tasks/run_ends.py,
expansion/failure_report.py), and the simulator's faults that stage them
(infra/sim/config.py, infra/sim/startup.py)."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from expansion.failure_report import failure_block
from infra.settings import load_settings
from infra.sim.config import Faults, fault_problem
from infra.sim.startup import injected_start_failure
from tasks.run_ends import OutputUnwritable, free_space_note, writing_output


def test_a_full_disk_becomes_output_unwritable_naming_what_and_where(tmp_path: Path) -> None:
    with (pytest.raises(OutputUnwritable, match=r"^writing shard 4 to .*: \[Errno 28\] No spa"),
          writing_output("shard 4", tmp_path)):
        raise OSError(errno.ENOSPC, "No space left on device")
    with (pytest.raises(OutputUnwritable, match="Read-only file system"),
          writing_output("the shard plan", tmp_path)):
        raise OSError(errno.EROFS, "Read-only file system")


def test_other_os_errors_stay_what_they_are(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError), writing_output("shard 1", tmp_path):
        (tmp_path / "missing" / "x").read_text()


def test_free_space_is_said_of_the_nearest_folder_that_exists(tmp_path: Path) -> None:
    note = free_space_note(tmp_path / "not" / "yet")
    assert " free of " in note and note.endswith(f"on the disk holding {tmp_path}/not/yet")


def servers_log(out: Path, name: str, text: str) -> None:
    (out / "servers").mkdir(parents=True, exist_ok=True)
    (out / "servers" / name).write_text(text)


def test_the_disk_block_says_how_full_and_what_to_do(tmp_path: Path) -> None:
    block = failure_block("output_unwritable", "writing shard 4 to /x: [Errno 28] No space "
                          "left on device", tmp_path)
    assert block[0] == ("error: the output's disk refused a write: writing shard 4 to /x: "
                        "[Errno 28] No space left on device")
    assert block[1].startswith("  disk: ") and " free of " in block[1]
    assert block[-2] == f"  safe: nothing was committed in {tmp_path} yet"
    assert block[-1].startswith("  advice: make room on that disk")


def test_the_bucket_block_reads_no_server_log_and_points_at_the_endpoint(
        tmp_path: Path) -> None:
    servers_log(tmp_path, "server-0-gpu0.log", "[t] Scheduler hit an exception: boom\n")
    block = failure_block("bucket_unreachable", "s3://b/p: Could not connect (after 5 tries)",
                          tmp_path)
    assert block[0] == ("error: the bucket could not be reached: s3://b/p: Could not connect "
                        "(after 5 tries)")
    assert not any("SGLang said" in line or "logs:" in line for line in block), block
    assert block[-1].startswith("  advice: check storage.endpoint_url")


READY = "[t] The server is fired up and ready to roll!\n"


def test_relaunches_that_never_came_up_get_the_hosts_advice(tmp_path: Path) -> None:
    servers_log(tmp_path, "server-0-gpu0.log", READY + "[t] Scheduler hit an exception: x\n")
    servers_log(tmp_path, "server-0-gpu0.relaunch.log",
                "[t] Scheduler hit an exception: Traceback (most recent call last):\n"
                "RuntimeError: CUDA error: unspecified launch failure\n")
    block = failure_block("fleet_down", "all 1 servers stopped answering", tmp_path)
    assert block[-1].startswith("  advice: the servers died mid-run and their relaunches "
                                "failed to start"), block


def test_relaunches_that_served_then_died_get_the_crash_advice(tmp_path: Path) -> None:
    servers_log(tmp_path, "server-0-gpu0.log", READY + "[t] Scheduler hit an exception: x\n")
    servers_log(tmp_path, "server-0-gpu0.relaunch.log",
                READY + "[t] Scheduler hit an exception: y\n")
    block = failure_block("fleet_down", "all 1 servers stopped answering", tmp_path)
    assert "relaunches failed to start" not in block[-1], block


def test_fail_restart_refuses_only_restarts() -> None:
    faults = Faults(fail_restart="error", start_marker_dir="/m")
    assert injected_start_failure(faults, 0.8, 81920, first_start=True) is None
    assert injected_start_failure(faults, 0.8, 81920, first_start=False) == (
        "simulated startup failure (fault injection)", "RuntimeError")
    oom = injected_start_failure(Faults(fail_start="oom"), 0.8, 81920, first_start=True)
    assert oom is not None and oom[1] == "torch.OutOfMemoryError"


@pytest.mark.parametrize(("faults", "says"), [
    ({"crash_on_txt": "X"}, "sim.faults: unknown fault 'crash_on_txt'; known: "),
    ({"fail_restart": "boom"}, "sim.faults.fail_restart: 'boom' is not 'oom' or 'error'"),
    ({"fail_restart": "error"}, "need start_marker_dir"),
    ({"degraded_ports": [30000]}, "need start_marker_dir"),
])
def test_a_fault_the_simulator_would_not_inject_is_refused_in_the_settings(
        faults: dict[str, object], says: str) -> None:
    assert says in (fault_problem(faults) or "")
    with pytest.raises(ValueError, match=r"sim\.faults"):
        load_settings(None, **{"sim.faults": faults})
