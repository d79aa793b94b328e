"""A stop signal that stops the run even where Python drops the exception it raises.

Prefect turns SIGTERM into `TerminationSignal` (and the CLI turns Ctrl-C and SIGTERM into
KeyboardInterrupt) by raising from a signal handler, which runs between two bytecodes of
whatever the main thread is doing. When that is a weakref callback, a `__del__` or a
finalizer, Python prints "Exception ignored" and goes on: the flow kept running, and the
tuner relaunched the servers the same signal had killed. So every stop signal is also
latched here, and the places where a run makes progress (a server start, an epoch, the
dispatcher's loop) deliver it again until it lands. Stop hooks and `finally` blocks hold
no such place: cleanup is never interrupted by the re-delivery.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Callable, Coroutine, Iterator
from types import FrameType
from typing import Any, TypeVar

T = TypeVar("T")

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# The signals received inside `latched_stop_signals`, in order. No lock: only handlers (which
# run in the main thread) and the scope's exit write it, and a handler that ran while the
# main thread held a lock would wait on it forever.
_latched: list[int] = []
STOP_POLL_S = 0.25  # how soon a dropped stop signal is delivered again inside an event loop


def _chained(previous: Any) -> Callable[[int, FrameType | None], None]:
    """A handler that latches the signal, then does what the handler it replaces did."""
    def handler(signum: int, frame: FrameType | None) -> None:
        if signum not in _latched:
            _latched.append(signum)
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL:  # the default action: restore it and let it act
            signal.signal(signum, signal.SIG_DFL)
            signal.raise_signal(signum)
    return handler


@contextlib.contextmanager
def latched_stop_signals() -> Iterator[None]:
    """Latch SIGINT and SIGTERM for the duration (main thread only: elsewhere Python
    delivers no signals, so there is nothing to latch). Handlers installed before it keep
    acting first; the latch is cleared on exit, so a later run in the process starts clean."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    for sig, handler in previous.items():
        if handler != signal.SIG_IGN:
            signal.signal(sig, _chained(handler))
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _latched.clear()


def stop_signalled() -> int | None:
    """The first stop signal received and not yet acted on, if any."""
    return _latched[0] if _latched else None


def deliver_pending_stop() -> None:
    """Deliver a latched stop signal again, through the handlers now installed (Prefect's
    TerminationSignal, the CLI's KeyboardInterrupt): called where a run is about to make
    progress. Off the main thread it does nothing (the main thread's next call delivers)."""
    signum = stop_signalled()
    if signum is None or threading.current_thread() is not threading.main_thread():
        return
    signal.raise_signal(signum)


async def until_done_or_stopped(work: Coroutine[Any, Any, T]) -> T:
    """Await `work` in a task of its own, delivering a latched stop signal in the awaiting
    task. asyncio keeps any BaseException but KeyboardInterrupt in the task it hit, so a
    TerminationSignal landing in one of the dispatcher's workers would end that worker
    only; delivered here, in the loop's main task, asyncio.run raises it."""
    task = asyncio.ensure_future(work)
    while not (await asyncio.wait({task}, timeout=STOP_POLL_S))[0]:
        deliver_pending_stop()
    deliver_pending_stop()  # what a signal broke on its way out is not why the run ends
    return task.result()
