"""`expansion install-automation` on a real Prefect server: a flow run whose process vanishes
is set Crashed by the automation (and only then can `prefect flow-run retry` resume it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import running_prefect_server

ROOT = Path(__file__).resolve().parents[2]

SLEEPY_FLOW = """
import time
from prefect import flow

@flow(name="sleepy")
def sleepy():
    time.sleep(600)

sleepy()
"""


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "expansion.cli", *args], capture_output=True,
                          text=True, cwd=ROOT, env={**os.environ, **env}, timeout=120)


def _flow_runs(env: dict[str, str]) -> list[dict[str, str]]:
    """The server's flow runs, read over its REST API (`POST /flow_runs/filter`). A Python
    child with Prefect's client, polled every few seconds, cost ~3 s of CPU per look."""
    import httpx

    answer = httpx.post(f"{env['PREFECT_API_URL']}/flow_runs/filter", json={}, timeout=30)
    answer.raise_for_status()
    return [{"state": run["state_type"], "message": (run.get("state") or {}).get("message") or ""}
            for run in answer.json()]


@pytest.mark.slow
def test_a_vanished_flow_run_is_crashed_by_the_installed_automation(tmp_path: Path) -> None:
    with running_prefect_server(tmp_path) as env:
        bad = _cli(env, "install-automation", "--heartbeat-s", "30", "--window-s", "40")
        assert bad.returncode == 2 and "window_s" in bad.stderr and "Traceback" not in bad.stderr
        first = _cli(env, "install-automation", "--heartbeat-s", "30", "--window-s", "60")
        assert first.returncode == 0 and "created" in first.stdout, first.stderr
        again = _cli(env, "install-automation", "--heartbeat-s", "30", "--window-s", "60")
        assert again.returncode == 0 and "updated" in again.stdout, again.stderr

        run_env = {**os.environ, **env, "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": "30"}
        proc = subprocess.Popen([sys.executable, "-c", SLEEPY_FLOW], env=run_env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                if [r for r in _flow_runs(env) if r["state"] == "RUNNING"]:
                    break
                time.sleep(1)
            else:
                pytest.fail("the flow run never reached Running")
            time.sleep(5)  # its first heartbeat goes out as it starts running
        finally:
            os.killpg(proc.pid, signal.SIGKILL)  # the "host" is gone: nothing reports it
            proc.wait()
        assert [r["state"] for r in _flow_runs(env)] == ["RUNNING"]
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            runs = _flow_runs(env)
            if runs[0]["state"] != "RUNNING":
                break
            time.sleep(3)
        assert runs[0]["state"] == "CRASHED", runs
        assert "no heartbeat" in runs[0]["message"]
