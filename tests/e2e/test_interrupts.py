"""Ctrl-C and SIGTERM end an ad-hoc run quickly and quietly, on Prefect's temporary API.

A terminal's Ctrl-C signals the whole foreground process group. The run's temporary Prefect
API used to be in that group, died first, and the run then spent minutes failing to record
its own end (1,917 lines, five tracebacks); `kill -TERM` left that API running. Both signals
are sent here as a user would: SIGINT to the run's process group, SIGTERM to its pid alone.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from infra.ledger import Ledger
from tests.conftest import free_port_block

ROOT = Path(__file__).resolve().parents[2]
EXPANSION = str(ROOT / ".venv" / "bin" / "expansion")


def processes_with(home: Path) -> list[int]:
    """Live processes started with PREFECT_HOME=home: the run, its temporary API (in a session
    of its own) and its simulated servers."""
    marker = f"PREFECT_HOME={home}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def interrupt_after_first_commit(args: list[str], env: dict[str, str], out: Path,
                                 sig: signal.Signals, whole_group: bool) -> tuple[int, str, float]:
    """Start the run in a session of its own (a terminal's foreground group), wait for it to
    commit a shard, send `sig`; returns (exit code, its output, seconds to exit)."""
    before = len(Ledger(out).committed()) if (out / "plan.json").exists() else 0
    proc = subprocess.Popen(args, env=env, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True, text=True)
    deadline = time.monotonic() + 180
    while not (out / "plan.json").exists() or len(Ledger(out).committed()) <= before:
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout and \
            proc.stdout.read()[-3000:]
        time.sleep(0.2)
    sent = time.monotonic()
    if whole_group:
        os.killpg(proc.pid, sig)
    else:
        os.kill(proc.pid, sig)
    output, _ = proc.communicate(timeout=60)
    took = time.monotonic() - sent
    time.sleep(0.5)  # a child's last instant after its parent's exit
    left = processes_with(Path(env["PREFECT_HOME"]))
    assert not left, f"still alive after {sig.name}: {left}"
    return proc.returncode, output, took


@pytest.mark.slow
def test_ctrl_c_and_sigterm_end_the_run_in_seconds_with_one_line(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env |= {"PREFECT_HOME": str(tmp_path / "prefect-home"), "COLUMNS": "200"}
    src = tmp_path / "p.jsonl"
    src.write_text("".join(json.dumps({"id": f"i{i}", "prompt": f"q {i}"}) + "\n"
                           for i in range(3000)))
    out = tmp_path / "out"
    args = [EXPANSION, "run", "--prompts", str(src), "--output", str(out), "--set",
            f"base_port={free_port_block(2)}", "--set", "shard_size=20", "--set",
            "sim.time_scale=1", "--set", "sim.startup_s=0.2", "--set", "tuning.enabled=false"]
    for sig, group in ((signal.SIGINT, True), (signal.SIGTERM, False)):
        code, output, took = interrupt_after_first_commit(args, env, out, sig, group)
        lines = [line for line in output.splitlines() if line.strip()]
        interrupted = [line for line in lines if line.startswith("interrupted: ")]
        assert code == 130 and took < 15, (sig.name, code, took, output[-3000:])
        assert "Traceback" not in output and "Error logging to API" not in output, output
        assert interrupted and "shards committed" in interrupted[0] and "resume" in \
            interrupted[0], output[-2000:]
    with sqlite3.connect(tmp_path / "prefect-home" / "prefect.db") as db:
        states = sorted(row[0] for row in db.execute("SELECT state_type FROM flow_run"))
    assert states == ["CRASHED", "CRASHED"]  # recorded before the temporary API stopped
