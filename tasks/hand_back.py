"""The requests each server is answering, so that a retired server's can be handed back.

A canary or rolling restart retires a server: it gets nothing new and its in-flight requests
have `tuning.drain_timeout_s` to finish. What still runs then is handed back — its HTTP wait
cancelled, the request put back in the queue for another server — instead of running until
the server stops: a stopping SGLang 0.5.17 server generates every in-flight answer to its end
before it exits, nobody reading it, until the stop's grace (30 s) runs out; with long answers
each canary and rollout restart was 34 s out of dispatch (5 s now). The closed connections make
SGLang abort those requests (the simulator too). Only the HTTP wait is cancelled, never a
commit: the dispatcher re-queues the item where it awaited the answer.
"""

from __future__ import annotations

import asyncio
from typing import Any


class InFlight:
    """The HTTP waits open on each server."""

    def __init__(self) -> None:
        self._by_server: dict[str, set[asyncio.Future[Any]]] = {}

    def track(self, server: str, post: asyncio.Future[Any]) -> None:
        posting = self._by_server.setdefault(server, set())
        posting.add(post)
        post.add_done_callback(posting.discard)

    def cancel(self, server: str) -> int:
        """Cancel every wait open on `server`; how many."""
        posting = list(self._by_server.get(server, ()))
        for post in posting:
            post.cancel()
        return len(posting)
