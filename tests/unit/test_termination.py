"""A stop signal whose exception Python drops still stops the run (infra/termination.py).

Each case runs in a child process of its own (a real SIGTERM to a pytest worker would end
the worker), under Prefect's own SIGTERM bridge where the flow has it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# The signal lands inside a weakref callback: Python prints "Exception ignored" and goes on.
# SIGTERM raises KeyboardInterrupt before any flow starts, as `expansion run` has it
# (cli_run._signals_as_interrupt); Prefect's bridge sends it there once its flow has crashed.
DROPPED = """
import gc, os, signal, weakref
signal.signal(signal.SIGTERM, signal.default_int_handler)
class Thing: pass
def drop_a_sigterm():
    thing = Thing()
    weakref.finalize(thing, lambda: os.kill(os.getpid(), signal.SIGTERM))
    del thing
    gc.collect()
"""


def run_child(body: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    code = textwrap.dedent(DROPPED) + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout_s)


def test_a_dropped_sigterm_is_latched_and_delivered_again_as_prefects_signal() -> None:
    child = run_child("""
        from prefect.exceptions import TerminationSignal
        from prefect.utilities.engine import capture_sigterm
        from infra.termination import deliver_pending_stop, latched_stop_signals, stop_signalled
        try:
            with capture_sigterm(), latched_stop_signals():
                drop_a_sigterm()
                print("went on after the signal; latched:", stop_signalled())
                try:
                    deliver_pending_stop()
                except TerminationSignal as exc:
                    print("delivered again:", exc.signal)
                    raise
        except KeyboardInterrupt:
            print("the run's own handler got it")
        print("latch after the scope:", stop_signalled())
    """)
    assert "Exception ignored" in child.stderr  # the drop is real, not staged
    assert "went on after the signal; latched: 15" in child.stdout, child.stderr
    assert "delivered again: 15" in child.stdout
    assert "the run's own handler got it" in child.stdout
    assert "latch after the scope: None" in child.stdout


def test_no_server_starts_after_a_dropped_stop_signal(tmp_path: Path) -> None:
    child = run_child(f"""
        from pathlib import Path
        from infra.processes import ProcessRegistry
        from infra.sglang.launch import LaunchSpec
        from infra.termination import latched_stop_signals
        from tasks.local_servers import launch_one
        marker = Path({str(tmp_path / "started")!r})
        spec = LaunchSpec(index=0, gpu=0, host="127.0.0.1", port=1,
                          argv=("touch", str(marker)), log_path=Path({str(tmp_path)!r}) / "s.log")
        try:
            with latched_stop_signals():
                drop_a_sigterm()
                launch_one(spec, ProcessRegistry(Path({str(tmp_path / "reg.json")!r})), "fp")
        except KeyboardInterrupt:
            print("interrupted before the launch")
        import time; time.sleep(0.5)
        print("server started:", marker.exists())
    """)
    assert "Exception ignored" in child.stderr
    assert "interrupted before the launch" in child.stdout, child.stderr
    assert "server started: False" in child.stdout


def test_a_signal_kept_in_a_worker_task_ends_the_event_loop() -> None:
    """asyncio keeps a TerminationSignal in the task it hit, and a gather with
    return_exceptions (as the dispatcher's ending has) keeps it there: without the latch the
    loop would run on for as long as it has work."""
    child = run_child("""
        import asyncio, os, signal, time
        from prefect.utilities.engine import capture_sigterm
        from infra.termination import latched_stop_signals, until_done_or_stopped
        async def worker():
            await asyncio.sleep(0.1)
            os.kill(os.getpid(), signal.SIGTERM)  # its exception lands in this task
        async def work():
            ended = await asyncio.gather(worker(), return_exceptions=True)
            print("the worker ended with", type(ended[0]).__name__)
            await asyncio.sleep(30)
            return "worked 30 s"
        began = time.monotonic()
        try:
            with capture_sigterm(), latched_stop_signals():
                print(asyncio.run(until_done_or_stopped(work())))
        except KeyboardInterrupt:
            print(f"stopped after {time.monotonic() - began:.1f} s")
    """)
    assert "the worker ended with TerminationSignal" in child.stdout, child.stderr
    assert "worked 30 s" not in child.stdout
    seconds = float(child.stdout.split("stopped after ")[1].split(" s")[0])
    assert seconds < 5
