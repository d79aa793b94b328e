"""The running dispatcher as another thread sees it: take a server out, put one back.

The tuning watch runs in its own thread while the dispatcher's event loop runs in the flow's;
a canary or a rolling restart must retire one server from dispatch (its in-flight requests
finish, nothing new goes to it), restart it, and admit it again with its new limit — while
every other server keeps generating. Every call hops onto the loop thread-safely.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tasks.dispatch import Dispatcher, Endpoint


HAND_BACK_WAIT_S = 5.0  # a cancelled request leaves the dispatcher's books at its next await


async def _call(fn: Callable[[str], int], name: str) -> int:
    return fn(name)


class DispatchEnded(RuntimeError):
    """The epoch's dispatch finished (work done, or the epoch is stopping)."""


class FleetControl:
    """A handle on the epoch's dispatcher, bound while it runs."""

    def __init__(self) -> None:
        self._dispatcher: Dispatcher | None = None
        self._lock = threading.Lock()
        # Set by whoever relaunches dead servers (the tuner's repair): whether one may still
        # come back. The dispatcher asks it before it calls a fleet with every server dead down.
        self.revival: Callable[[], bool] | None = None
        self._restarting = 0  # servers out of dispatch for a restart now (RollingFleet)

    def bind(self, dispatcher: Dispatcher) -> None:
        with self._lock:
            self._dispatcher = dispatcher
        dispatcher.may_revive = self._may_revive

    def _may_revive(self) -> bool:
        revival = self.revival
        return self._restarting > 0 or (revival is not None and revival())

    @contextlib.contextmanager
    def restarting(self) -> Iterator[None]:
        """Around a server's restart: while it lasts, a fleet with no server in dispatch is
        waiting for this one, not down."""
        with self._lock:
            self._restarting += 1
        try:
            yield
        finally:
            with self._lock:
                self._restarting -= 1

    def unbind(self) -> None:
        with self._lock:
            self._dispatcher = None

    def _bound(self) -> tuple[Dispatcher, asyncio.AbstractEventLoop]:
        with self._lock:
            d = self._dispatcher
        if d is None or d.loop is None or d.loop.is_closed():
            raise DispatchEnded("the epoch's dispatch is not running")
        return d, d.loop

    @property
    def running(self) -> bool:
        try:
            self._bound()
        except DispatchEnded:
            return False
        return True

    def retire(self, name: str) -> None:
        d, loop = self._bound()
        loop.call_soon_threadsafe(d.retire, name)

    def wait_drained(self, name: str, timeout_s: float) -> int:
        """Wait until `name` has nothing in flight (or the timeout), then hand what is left
        to the other servers (Dispatcher.hand_back) and wait for the hand-back; returns how
        many requests were handed back."""
        deadline = time.monotonic() + timeout_s
        while True:
            d, loop = self._bound()
            left = d.in_flight_on(name)
            if left == 0:
                return 0
            if time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        asyncio.run_coroutine_threadsafe(_call(d.hand_back, name), loop).result(10.0)
        settled = time.monotonic() + HAND_BACK_WAIT_S
        while d.in_flight_on(name) and time.monotonic() < settled:
            time.sleep(0.02)
        return left

    def join(self, endpoint: Endpoint, timeout_s: float = 30.0) -> None:
        d, loop = self._bound()
        asyncio.run_coroutine_threadsafe(d.join(endpoint), loop).result(timeout_s)
