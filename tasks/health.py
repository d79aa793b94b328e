"""Wait until every server answers /health with 200, or say which one failed and why.

A server whose process exits during startup is reported at once with the tail of its log
(SGLang's own error is there), instead of waiting for the deadline.
"""

from __future__ import annotations

import threading
import time

from infra.processes import is_ours_and_alive
from infra.sglang.client import is_healthy
from infra.sglang.secret_config import discard, secret_file_of
from infra.termination import deliver_pending_stop
from tasks.local_servers import ServerHandle

LOG_TAIL_LINES = 15


class ServerStartFailed(RuntimeError):
    """A server exited or did not become healthy in time."""

    def __init__(self, message: str, handle: ServerHandle, log_tail: str) -> None:
        super().__init__(message)
        self.handle = handle
        self.log_tail = log_tail


def log_tail(path: str, lines: int = LOG_TAIL_LINES, window: int = 65536) -> str:
    """The log's last `lines` non-empty lines, from its last `window` bytes only: a server log
    of a long job runs to gigabytes."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - window))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join([x for x in text.splitlines() if x.strip()][-lines:])


class StartAborted(ServerStartFailed):
    """The wait was called off (the epoch is ending); the server is stopped with the fleet."""


def wait_until_healthy(handles: list[ServerHandle], api_key: str | None,
                       timeout_s: float, poll_s: float = 0.25,
                       abort: threading.Event | None = None) -> float:
    """Block until all are healthy; return the seconds it took. Raise ServerStartFailed."""
    started = time.monotonic()
    deadline = started + timeout_s
    pending = list(handles)
    while pending:
        deliver_pending_stop()  # a stop signal Python dropped: not a server that died starting
        for handle in list(pending):
            # (pid 0: a server someone else runs, engine=external — only its /health counts)
            if handle.record.pid and not is_ours_and_alive(handle.record):
                tail = log_tail(handle.log_path)
                raise ServerStartFailed(
                    f"server {handle.index} (GPU {handle.gpu}, {handle.url}) exited during "
                    f"startup; its log {handle.log_path} ends with:\n{tail}", handle, tail)
            if is_healthy(handle.url, api_key, timeout_s=5.0):
                pending.remove(handle)
                discard(secret_file_of(handle.record.argv))  # parsed at startup; not needed
        if not pending:
            break
        if abort is not None and abort.is_set():
            raise StartAborted(f"stopped waiting for {pending[0].url}: the epoch is ending",
                               pending[0], "")
        if time.monotonic() > deadline:
            first = pending[0]
            tail = log_tail(first.log_path)
            raise ServerStartFailed(
                f"{len(pending)} server(s) not healthy after {timeout_s:.0f} s "
                f"(startup_timeout_s); first: {first.url}, log {first.log_path}:\n{tail}",
                first, tail)
        time.sleep(poll_s)
    return time.monotonic() - started
