"""What the dispatcher keeps per server, prompt and shard, and how a request can fail.

Apart from tasks/dispatch.py so the dispatcher's module holds its behaviour, not its records.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from infra.prompt_row import PromptRow


@dataclass(frozen=True)
class Endpoint:
    name: str
    url: str
    limit: int
    fingerprint: str  # of its server flags, recorded with each completion
    version: str | None = None  # the server's SGLang version, recorded with each completion
    primes_prefixes: bool = False  # its cache cannot resume at branch points (no_buffer)


# the work a dispatcher is handed: (shard, its rows), in shard order
Shards = Iterator[tuple[int, list[PromptRow]]]
# commits one shard: (shard, its output rows, its error rows)
CommitFn = Callable[[int, list[dict[str, Any]], list[dict[str, Any]]], Awaitable[None]]


@dataclass
class WorkItem:
    shard: int
    index: int  # position in the shard: row × samples + sample
    row: PromptRow
    sample: int = 0
    attempts: int = 0
    last_error: str = ""
    killed: list[str] = field(default_factory=list)  # servers that died while it ran on them


@dataclass
class ShardState:
    size: int
    results: dict[int, dict[str, Any]] = field(default_factory=dict)
    errors: dict[int, dict[str, Any]] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return len(self.results) + len(self.errors) == self.size


class PermanentFailure(Exception):
    pass


class TransientFailure(Exception):
    """`connect`: the server refused the connection (the request never reached it);
    `lost`: the connection broke mid-request — the server may have died under it."""

    def __init__(self, message: str, connect: bool = False, lost: bool = False) -> None:
        super().__init__(message)
        self.connect = connect
        self.lost = lost


@dataclass
class DispatchStats:
    completed: int = 0
    errors: int = 0
    output_tokens: int = 0
    retries: int = 0
    primers: int = 0  # groups whose shared prefix went first (tasks/affinity.py)
    handed_back: int = 0  # requests a retired server still ran, re-queued (Dispatcher.hand_back)
    started: float = field(default_factory=time.monotonic)

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started
