"""The run's leak check finds what a test left running, and only that."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from tests import session


def test_a_process_left_running_is_found_and_killed() -> None:
    session.mark_run()
    left = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                            start_new_session=True)  # its own group: a killpg would miss it
    try:
        found = _until_listed(left.pid)
        assert any(line.startswith(f"pid {left.pid}:") for line in found), found
        session.kill_leftovers([line for line in found if line.startswith(f"pid {left.pid}:")])
        left.wait(timeout=10)
        assert left.returncode is not None
        time.sleep(0.1)
        assert not any(f"pid {left.pid}:" in line for line in session.leftover_processes())
    finally:
        if left.poll() is None:
            left.kill()
            left.wait()


def _until_listed(pid: int, within_s: float = 10.0) -> list[str]:
    """The leak check's list once it shows `pid`: a child read while it is still starting
    (its /proc/PID/environ not yet readable as the exec'd program's) can be missed, and a
    single early read failed once under a loaded suite."""
    deadline = time.monotonic() + within_s
    while True:
        found = session.leftover_processes()
        if any(line.startswith(f"pid {pid}:") for line in found) or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def test_a_process_of_another_run_is_not_this_runs_leak() -> None:
    session.mark_run()
    env = {**os.environ, session.RUN_MARK: "another-run"}
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        assert not any(f"pid {other.pid}:" in line for line in session.leftover_processes())
    finally:
        other.kill()
        other.wait()
