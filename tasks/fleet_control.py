"""The running dispatcher as another thread sees it: take a server out, put one back.

The tuning watch runs in its own thread while the dispatcher's event loop runs in the flow's;
a canary or a rolling restart must retire one server from dispatch (its in-flight requests
finish, nothing new goes to it), restart it, and admit it again with its new limit — while
every other server keeps generating. Every call hops onto the loop thread-safely.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tasks.dispatch import Dispatcher, Endpoint


class DispatchEnded(RuntimeError):
    """The epoch's dispatch finished (work done, or the epoch is stopping)."""


class FleetControl:
    """A handle on the epoch's dispatcher, bound while it runs."""

    def __init__(self) -> None:
        self._dispatcher: Dispatcher | None = None
        self._lock = threading.Lock()

    def bind(self, dispatcher: Dispatcher) -> None:
        with self._lock:
            self._dispatcher = dispatcher

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
        """Wait until `name` has nothing in flight (or the timeout); returns what is left —
        those requests fail over to the other servers when this one stops."""
        deadline = time.monotonic() + timeout_s
        while True:
            d, _ = self._bound()
            left = d.in_flight_on(name)
            if left == 0 or time.monotonic() >= deadline:
                return left
            time.sleep(0.05)

    def join(self, endpoint: Endpoint, timeout_s: float = 30.0) -> None:
        d, loop = self._bound()
        asyncio.run_coroutine_threadsafe(d.join(endpoint), loop).result(timeout_s)
