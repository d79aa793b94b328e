"""Prefix affinity: prompts that share a long prefix go to one server, one of them first.

Why (measured on real SGLang 0.5.17, docs/TUNING.md "Prefix reuse"): the radix cache reuses a
prefix only once a request that carries it has been prefilled. Prompts of one group that
arrive together are prefilled in one batch and share nothing — 2.7 % of prompt tokens came
from the cache when a group's four members were sent back to back, 8 at a time — while one
member first and the rest after it gave 91.5 %. Spread over N servers, a group also pays its
first prefill on every server it lands on.

So each prompt gets a key (its first `key_chars` characters, or token ids); a key belongs to
one live server (rendezvous hashing: when servers leave or join, only their keys move). The
first prompt of a key on its server is the *leader*; later ones wait until the leader has
been answered (or `leader_wait_s` has passed: its prefill is long done by then, and a job
whose prompts all share one system prompt must not idle for a whole generation), then go to
that server. An idle server takes from the shared line, then steals
from the longest line of another — a group's leader if that line has one (the group then
follows it to its new server, nothing is lost), else its last prompt: affinity never leaves a
GPU without work. Prompts shorter
than `key_chars` have nothing long to share and go to the shared line.

A server whose radix cache cannot resume where a prompt branches off a cached one (no_buffer:
it keeps mamba states only where cached sequences end) gains nothing from a leader: its
followers branch off it (real: 5.0 % reused). For such a server the group is *primed*: the
bare prefix its first two prompts share, cut on a token boundary, goes first as a one-token
request, and the whole group follows it (real, the bare prefix first: 98.5 % reused).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import json
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any, Protocol

from infra.prompt_row import PromptRow

STEAL_SCAN = 64  # prompts at the end of a line searched for a leader to steal
MIN_PRIMER_CHARS = 256  # a shared prefix shorter than this is not worth a request
WARM_KEYS_KEPT = 65_536  # (server, key) pairs remembered as warm; older ones count as cold


class Routable(Protocol):
    row: PromptRow


def prefix_key(row: PromptRow, key_chars: int) -> str | None:
    """The group a prompt belongs to: its first `key_chars` characters (a token id counts as
    four), or None when it is shorter — or when affinity is off (key_chars 0)."""
    if key_chars <= 0:
        return None
    if row.input_ids is not None:
        ids = list(row.input_ids)
        n = max(1, key_chars // 4)
        head = json.dumps(ids[:n]) if len(ids) >= n else None
    elif row.messages is not None:
        text = "".join(str(m.get("content") or "") for m in row.messages[:-1]
                       ) or str(row.messages[-1].get("content") or "")
        head = text[:key_chars] if len(text) >= key_chars else None
    else:
        text = str(row.prompt or "")
        head = text[:key_chars] if len(text) >= key_chars else None
    return None if head is None else hashlib.blake2b(head.encode(), digest_size=8).hexdigest()


def shared_prefix_row(a: PromptRow, b: PromptRow) -> PromptRow | None:
    """A primer for the group of `a` and `b`: the prefix they share, cut where both prompts
    have a token boundary, as an input row — or None (chat rows: the template decides the
    tokens; or too short). Token ids are cut exactly. Text is cut before a space that follows
    a letter or digit: BPE pre-tokenizers (and SentencePiece's ▁) start a token there, so the
    primer's tokens are the first tokens of both prompts; a cut elsewhere (before "\n\n"
    after a full stop, say) can fall inside a token and the primer would match nothing."""
    if a.input_ids is not None and b.input_ids is not None:
        ids_a = list(a.input_ids)
        n = common_length(ids_a, list(b.input_ids))
        return PromptRow(None, input_ids=ids_a[:n]) if 4 * n >= MIN_PRIMER_CHARS else None
    if a.messages is not None or b.messages is not None:
        return None
    text_a, text_b = str(a.prompt or ""), str(b.prompt or "")
    cut = common_length(text_a, text_b)
    if cut == len(text_a) or cut == len(text_b):
        return None  # one prompt is the other's prefix: the shorter one primes by itself
    while cut > 0 and not (text_a[cut] == " " and text_a[cut - 1].isalnum()):
        cut -= 1
    return PromptRow(None, prompt=text_a[:cut]) if cut >= MIN_PRIMER_CHARS else None


def common_length(a: Any, b: Any) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class Primer:
    """A one-token request carrying a group's shared prefix (not a prompt of the job); it
    leads its group in `_leaders` as a leader prompt would."""

    def __init__(self, row: PromptRow) -> None:
        self.row = row


def owner(key: str, servers: list[str]) -> str:
    """Rendezvous (highest-random-weight) hashing: stable while the server set is."""
    return max(servers, key=lambda s: hashlib.blake2b(f"{s}|{key}".encode(),
                                                      digest_size=8).digest())


class AffinityQueue:
    """The dispatcher's queue of prompts, routed by prefix. `live()` names the servers that
    take work now; workers ask `get(server)` and report `done(item)` once answered."""

    def __init__(self, key_chars: int, live: Callable[[], list[str]],
                 leader_wait_s: float = 2.0,
                 primes: Callable[[str], bool] = lambda _server: False,
                 side: Callable[[str], Any | None] = lambda _server: None) -> None:
        self.key_chars = key_chars
        self._side = side  # server -> a prompt held outside the queue it may take first
        self.leader_wait_s = leader_wait_s
        self._live = live
        self._primes = primes  # server -> its cache cannot resume at branch points
        self._shared: deque[Any] = deque()
        self._lines: dict[str, deque[Any]] = {}
        self._held: dict[str, list[Any]] = {}  # key -> prompts waiting for its leader
        self._deadlines: deque[tuple[float, str, str]] = deque()  # (at, key, server), oldest first
        self._leaders: dict[int, str] = {}  # id(leader item) -> its key
        self._lead_at: dict[str, str] = {}  # key -> the server its leader runs on
        self._warm: OrderedDict[tuple[str, str], None] = OrderedDict()  # (server, key), LRU
        self._home: OrderedDict[str, str] = OrderedDict()  # key -> server that stole its leader
        self._size = 0
        # idle workers, per server: a prompt wakes one (its server's first), as asyncio.Queue
        # does — an Event would wake every idle worker of the fleet for each prompt
        self._waiters: dict[str, deque[asyncio.Future[None]]] = {}
        self.stolen = 0
        self.grouped = 0  # prompts sent to a server that had their prefix already
        self.primed = 0  # groups whose shared prefix went first as a Primer

    def qsize(self) -> int:
        return self._size

    def _server_for(self, key: str, live: list[str]) -> str:
        home = self._home.get(key)
        return home if home in live else owner(key, live)

    def put(self, item: Routable) -> None:
        """Queue a prompt (new, or back after a failure)."""
        self._size += 1
        key = prefix_key(item.row, self.key_chars)
        live = self._live()
        if key is None or not live:
            self._shared.append(item)
        elif id(item) in self._leaders:  # a leader retried: it goes first again
            self._line(self._server_for(key, live)).appendleft(item)
        elif key in self._held:
            self._held[key].append(item)
        else:
            server = self._server_for(key, live)
            if (server, key) in self._warm:
                self._warm.move_to_end((server, key))
                self.grouped += 1
                self._line(server).append(item)
            else:
                self._leaders[id(item)] = key
                self._lead_at[key] = server
                self._held[key] = []
                self._deadlines.append((time.monotonic() + self.leader_wait_s, key, server))
                self._line(server).append(item)
        self._wake(self._server_for(key, live) if key is not None and live else None)

    def done(self, item: Routable) -> None:
        """The prompt was answered (or failed for good): a leader's group may follow now."""
        key = self._leaders.pop(id(item), None)
        if key is not None:
            self._release(key, self._lead_at.pop(key, ""))

    def _release(self, key: str, server: str) -> None:
        """The leader's prefix is cached on `server` now: its group follows it there."""
        self._warm[(server, key)] = None
        while len(self._warm) > WARM_KEYS_KEPT:
            self._warm.popitem(last=False)
        waiting = self._held.pop(key, [])
        live = self._live()
        if not live:
            self._size -= len(waiting)
            for follower in waiting:
                self.put(follower)
            return
        home = self._server_for(key, live)
        # to the front: their prefix is cached now (and stealing takes from the back)
        self._line(home).extendleft(reversed(waiting))
        self.grouped += len(waiting)
        self._wake(home, len(waiting))

    def wake(self, server: str | None) -> None:
        """Something outside the queue may be there for `server` (None: for any)."""
        self._wake(server)

    def _wake(self, server: str | None, n: int = 1) -> None:
        """Wake up to n idle workers, `server`'s own first, then any server's."""
        lines = ([self._waiters[server]] if server in self._waiters else []) + list(
            self._waiters.values())
        for waiting in lines:
            while n and waiting:
                fut = waiting.popleft()
                if not fut.done():
                    fut.set_result(None)
                    n -= 1
            if not n:
                return

    def forget(self, server: str) -> None:
        """A server restarted (its cache is empty) or left: its keys are cold again."""
        for pair in [p for p in self._warm if p[0] == server]:
            del self._warm[pair]
        for key in [k for k, home in self._home.items() if home == server]:
            del self._home[key]

    async def get(self, server: str) -> Any:
        while True:
            self._release_overdue()
            held = self._side(server)  # a suspect (tasks/suspects.py): not in the count
            if held is not None:
                return held
            item = self._take(server)
            if item is not None:
                self._size -= 1
                return self._primer_for(item, server) or item
            await self._idle(server)

    async def _idle(self, server: str) -> None:
        """Until a prompt may be there for `server` — or 0.25 s, for held groups' deadlines."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiting = self._waiters.setdefault(server, deque())
        waiting.append(fut)
        timer = asyncio.get_running_loop().call_later(0.25, _resolve, fut)
        try:
            await fut
        finally:
            timer.cancel()
            if not fut.done() or fut in waiting:  # timed out or cancelled: not popped
                with contextlib.suppress(ValueError):
                    waiting.remove(fut)

    def _primer_for(self, item: Any, server: str) -> Primer | None:
        """For a leader bound to a server that needs one, a Primer that leads its group
        instead: the leader goes back, first of the prompts that wait for the primer."""
        key = self._leaders.get(id(item))
        held = self._held.get(key or "")
        if key is None or not held or not self._primes(server):
            return None
        row = shared_prefix_row(item.row, held[0].row)
        if row is None:
            return None
        primer = Primer(row)
        del self._leaders[id(item)]
        self._leaders[id(primer)] = key
        held.insert(0, item)
        self._size += 1  # the leader waits again
        self.primed += 1
        return primer

    def _release_overdue(self) -> None:
        now = time.monotonic()
        while self._deadlines and self._deadlines[0][0] <= now:
            _, key, server = self._deadlines.popleft()
            if key in self._held:  # the leader may have been stolen meanwhile
                self._release(key, self._lead_at.get(key, server))

    def _line(self, server: str) -> deque[Any]:
        return self._lines.setdefault(server, deque())

    def _take(self, server: str) -> Any | None:
        own = self._lines.get(server)
        if own:
            return own.popleft()
        if self._shared:
            return self._shared.popleft()
        busiest = max(self._lines.values(), key=len, default=None)
        if not busiest:
            return None
        self.stolen += 1
        for item in itertools.islice(reversed(busiest), STEAL_SCAN):
            key = self._leaders.get(id(item))
            if key is not None:  # a new group: it moves here whole
                busiest.remove(item)
                self._lead_at[key] = server
                self._home[key] = server
                while len(self._home) > WARM_KEYS_KEPT:
                    self._home.popitem(last=False)
                return item
        return busiest.pop()


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
