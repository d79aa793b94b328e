"""Replays in a process of their own, so that scoring moves never stalls generation.

A replay (`replay.replay_requests`) is seconds of pure Python for long outputs at a high cap.
Run in the generating process, the tuner's scoring held the GIL against the dispatcher's
thread: an asyncio loop beside three replays slowed from 1 ms to ~37 ms an iteration (worst
0.56 s), the client sent nothing for seconds, and in tests/e2e/test_tuning.py the whole
four-server fleet drained to 0 tok/s while a move was being chosen. Here one long-lived child
(started on first use, dying with its parent) runs them; arguments and results cross as pickles
over its stdin and stdout. Plain `subprocess` rather than multiprocessing: no semaphores, no
resource tracker left behind.

A process that serves nothing (`expansion plan`) computes its replays itself
(`WORKER.in_process = True`): the child's start and imports would cost it more than the
replays (1.9 s against 0.8 s for a 35B-A3B plan of seven alternatives).
"""

from __future__ import annotations

import atexit
import os
import pickle
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from infra.processes import die_with_parent

ROOT = Path(__file__).resolve().parents[2]


class ReplayWorker:
    """The child process and the lock that keeps one request in flight at a time."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self.in_process = False  # True where nothing else runs that a replay could stall

    def replay(self, *args: Any) -> Any:
        """`replay.replay_requests(*args)`, computed in the child."""
        return self.replay_many([args])[0]

    def replay_many(self, jobs: list[tuple[Any, ...]]) -> list[Any]:
        """`replay.replay_requests(*args)` for each argument tuple, in one trip to the child.
        A child that died (it dies with the thread that started it) is started again, once."""
        if self.in_process:
            from infra.sim.replay import replay_requests

            return [replay_requests(*args) for args in jobs]
        args = tuple(jobs)
        with self._lock:
            try:
                ok, value = self._ask(args)
            except (EOFError, BrokenPipeError):
                self.stop()
                ok, value = self._ask(args)
        if not ok:
            raise RuntimeError(f"replay failed in the worker: {value}")
        return value

    def _ask(self, args: tuple[Any, ...]) -> tuple[bool, Any]:
        proc = self._running()
        assert proc.stdin is not None and proc.stdout is not None
        pickle.dump(args, proc.stdin)
        proc.stdin.flush()
        answer: tuple[bool, Any] = pickle.load(proc.stdout)
        return answer

    def _running(self) -> subprocess.Popen[bytes]:
        if self._proc is None or self._proc.poll() is not None:
            path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "infra.sim.replay_worker"], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": path},
                preexec_fn=die_with_parent)
        return self._proc

    def stop(self) -> None:
        """Close the child's stdin (it exits at EOF) and reap it."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


WORKER = ReplayWorker()
atexit.register(WORKER.stop)


def main() -> None:
    """The child: one pickled argument tuple in, one (ok, result or message) out, until EOF.
    Its stdout carries only pickles; anything printed goes to stderr."""
    results = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    from infra.sim.replay import replay_requests

    requests = sys.stdin.buffer
    while True:
        try:
            args = pickle.load(requests)
        except EOFError:
            return
        try:
            answer: tuple[bool, Any] = (True, [replay_requests(*job) for job in args])
        except Exception as exc:  # sent back to the caller, who raises it there
            answer = (False, f"{type(exc).__name__}: {exc}")
        pickle.dump(answer, results)
        results.flush()


if __name__ == "__main__":
    main()
