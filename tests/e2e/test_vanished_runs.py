"""`kill -9` of an ad-hoc `expansion run`: the next run on that Prefect database marks the
dead run Crashed (it would stay Running forever and the UI would lie), and resumes the job."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import free_port_block
from tests.session import migrated_home

ROOT = Path(__file__).resolve().parents[2]
EXPANSION = str(ROOT / ".venv" / "bin" / "expansion")


@pytest.mark.slow
def test_killed_cli_run_is_marked_crashed_by_the_next_run(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env["PREFECT_HOME"] = str(tmp_path / "prefect-home")
    src = tmp_path / "p.jsonl"
    src.write_text("".join(json.dumps({"id": f"i{i}", "prompt": f"q {i}"}) + "\n"
                           for i in range(400)))
    out = tmp_path / "out"
    args = [EXPANSION, "run", "--prompts", str(src), "--output", str(out), "--set",
            f"base_port={free_port_block(2)}", "--set", "shard_size=20", "--set",
            "sim.time_scale=2", "--set", "sim.startup_s=0.2", "--set", "tuning.enabled=false"]
    # A migrated database (tests/session.py): two processes migrating one new SQLite file at
    # once is a known Prefect failure ("database is locked"), not this test's subject.
    migrated_home(tmp_path / "prefect-home")
    log = tmp_path / "first.log"
    with open(log, "wb") as sink:
        first = subprocess.Popen(args, env=env, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT,
                                 start_new_session=True)
    manifest = out / "manifest.jsonl"
    deadline = time.monotonic() + 240
    while not (manifest.exists() and manifest.read_text().strip()):
        assert first.poll() is None and time.monotonic() < deadline, (
            f"first run never committed; its output ends:\n{log.read_text()[-3000:]}")
        time.sleep(0.5)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(30)
    second = subprocess.run([*args[:-6], "--set", "sim.time_scale=500", "--set",
                             "sim.startup_s=0.2", "--set", "tuning.enabled=false"],
                            env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr[-2000:]
    assert "its process is gone; marked Crashed" in second.stderr
    # What the UI shows is what the database holds.
    with sqlite3.connect(tmp_path / "prefect-home" / "prefect.db") as db:
        states = sorted(row[0] for row in db.execute("SELECT state_type FROM flow_run"))
    assert states == ["COMPLETED", "CRASHED"]
    assert len(manifest.read_text().splitlines()) == 20  # every shard, once


def _processes_with(marker: str) -> list[int]:
    """Pids whose environment holds `marker` (this test's PREFECT_HOME): the run, its
    servers and its temporary Prefect API all inherit it."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if marker.encode() in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@pytest.mark.slow
def test_a_ctrl_c_run_ends_in_seconds_with_one_line_and_nothing_left(tmp_path: Path) -> None:
    """Ctrl-C reaches the terminal's whole foreground group (the run, its servers; the
    temporary Prefect API runs in a session of its own: infra/prefect_api.py). It took
    78–218 s and printed up to 1,917 lines with five tracebacks when that API died first.
    (SIGTERM goes through the same handler, cli_run._signals_as_interrupt; one signal here
    keeps the suite's time: each run costs ~40 s of start-up.)"""
    home = tmp_path / "prefect-home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env["PREFECT_HOME"] = str(home)
    src = tmp_path / "p.jsonl"
    src.write_text("".join(json.dumps({"id": f"i{i}", "prompt": f"q {i}"}) + "\n"
                           for i in range(2000)))
    out = tmp_path / "out"
    migrated_home(home)
    run = subprocess.Popen(
        [EXPANSION, "run", "--prompts", str(src), "--output", str(out), "--set",
         f"base_port={free_port_block(2)}", "--set", "shard_size=20", "--set",
         "sim.time_scale=1", "--set", "sim.startup_s=0.2", "--set", "tuning.enabled=false"],
        env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True)
    manifest = out / "manifest.jsonl"
    deadline = time.monotonic() + 240
    while not (manifest.exists() and manifest.read_text().strip()):
        assert run.poll() is None and time.monotonic() < deadline, "the run never committed"
        time.sleep(0.5)
    sent = time.monotonic()
    os.killpg(run.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
    output, _ = run.communicate(timeout=60)
    took = time.monotonic() - sent
    text = output.decode(errors="replace")
    assert took <= 15.0, f"{took:.1f} s to exit; output ends:\n{text[-2000:]}"
    assert run.returncode == 130 and "Traceback" not in text, text[-3000:]
    assert "interrupted: " in text and "run the same command again to resume" in text
    time.sleep(1.0)
    assert _processes_with(str(home)) == [], "a process of the run outlived it"
    with sqlite3.connect(home / "prefect.db") as db:
        states = [row[0] for row in db.execute("SELECT state_type FROM flow_run")]
    assert states in (["CRASHED"], ["CANCELLED"])
