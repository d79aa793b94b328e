"""The client's starvation, read from the kernel on a real starved process: a child pinned to
one CPU beside two busy loops pinned to the same CPU runs the fleet monitor while its main
thread works (the dispatcher's place). Its feed must read starved, and a child asleep that
holds its CPU whenever it wants it (SCHED_FIFO) must not. Children only: the test process's
own CPU affinity and priority are never changed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

CHILD = """
import json, multiprocessing as mp, os, sys, time
from tasks.feed import STARVED_SHARE
from tasks.monitor import FleetMonitor, SGLangMetrics

def spin():
    os.sched_setaffinity(0, {cpu})
    while True:
        pass

os.sched_setaffinity(0, {cpu})
if sys.argv[2] == "first":  # the CPU is its own whenever it is runnable, whatever else runs
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))  # threads inherit it
    except PermissionError:
        print(json.dumps({"skip": "SCHED_FIFO needs CAP_SYS_NICE"}))
        sys.exit(0)
busy = [mp.Process(target=spin, daemon=True) for _ in range(int(sys.argv[1]))]
for b in busy:
    b.start()
monitor = FleetMonitor(0.25, None, SGLangMetrics()).start()
end = time.monotonic() + 2.0
if busy:
    while time.monotonic() < end:
        sum(range(1000))  # the dispatcher's work, on the starved CPU
else:
    time.sleep(2.0)
monitor.stop()
for b in busy:
    b.kill()
shares = [f.wait_share for f in monitor.feed_snapshot() if f.wait_share is not None]
print(json.dumps({"max": max(shares), "starved": sum(s >= STARVED_SHARE for s in shares),
                  "n": len(shares)}))
"""


def _child(spinners: int, priority: str = "normal") -> dict[str, float]:
    import os

    cpu = sorted(os.sched_getaffinity(0))[0]
    proc = subprocess.run([sys.executable, "-c", CHILD.replace("{cpu}", f"{{{cpu}}}"),
                           str(spinners), priority], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if "skip" in result:
        pytest.skip(result["skip"])
    return dict(result)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="Linux's per-thread counters")
def test_a_client_sharing_its_cpu_with_two_busy_loops_reads_starved() -> None:
    got = _child(2)
    # three runnable processes on one CPU: the main thread waits about two thirds of the time
    assert got["n"] >= 4 and got["starved"] >= got["n"] / 2, got


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="Linux's per-thread counters")
def test_a_client_asleep_reads_fed() -> None:
    # Alone on its CPU: in a loaded suite the CPU it is pinned to runs other tests' processes,
    # which the probe rightly reads as starvation (1 of 7 samples once); real-time priority
    # gives it the CPU whenever it is runnable, which is what fed means.
    got = _child(0, "first")
    assert got["n"] >= 4 and got["starved"] == 0, got
