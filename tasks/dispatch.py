"""The async dispatcher: per-server in-flight limits, retries, shard assembly.

Each server gets as many worker coroutines as its in-flight limit; all pull from one queue,
so a free slot anywhere takes the next prompt (least-loaded routing without bookkeeping).
Workers share small httpx clients of at most POOL_CONNECTIONS connections each, never one big
pool: httpcore's pool bookkeeping is quadratic in its connection count (encode/httpcore#1035,
still open in 1.0.9), and with ~450 connections in one pool it ate most of a core and starved
the servers (docs/BENCHMARKS.md).
Transient failures (connection errors, 5xx, timeouts) are retried with exponential backoff
and jitter, on whichever server is free next; a server that keeps refusing connections is
dropped. A prompt that fails permanently (4xx, or too many tries) becomes an error row with
its reason, and the job goes on. A shard is committed as soon as all its rows are in.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import httpx

from infra.output_row import Answer, ErrorRow
from infra.sglang.client import auth_headers, tls_context
from tasks.affinity import AffinityQueue, Primer
from tasks.dispatch_records import (
    CommitFn,
    DispatchStats,
    Endpoint,
    PermanentFailure,
    Shards,
    ShardState,
    TransientFailure,
    WorkItem,
)
from tasks.first_batch import FirstBatchWatch, FleetCannotServe
from tasks.hand_back import InFlight
from tasks.requests import Delivery, DispatchOptions, MalformedAnswer, output_row, unsendable
from tasks.run_ends import FleetDown, RunEnd
from tasks.suspects import DeathVerdicts, SuspectLane, quarantined

__all__ = ["DispatchOptions", "DispatchStats", "Dispatcher", "Endpoint"]

log = logging.getLogger("expansion.dispatch")

DEAD_AFTER_CONNECT_FAILURES = 3
POOL_CONNECTIONS = 16  # workers per httpx client; each worker holds at most one connection


class Dispatcher:
    """Runs pending shards through the fleet and commits each shard when it is complete."""

    def __init__(self, endpoints: list[Endpoint], opts: DispatchOptions, commit: CommitFn,
                 stop: asyncio.Event | None = None, drain_timeout_s: float = 60.0) -> None:
        if not endpoints:
            raise FleetDown("no healthy servers to dispatch to")
        self.endpoints = endpoints
        self.opts = opts
        self.commit = commit
        self.stop = stop or asyncio.Event()
        self.drain_timeout_s = drain_timeout_s
        self.stats = DispatchStats()
        # prompts that were on a server when it died: held out of the queue, handed out by it
        self._suspects = SuspectLane(lambda server: self._queue.wake(server))
        self._deaths = DeathVerdicts()  # one /health verdict per server death
        self._queue = AffinityQueue(opts.prefix_key_chars,
                                    lambda: [e.name for e in self._live()],
                                    primes=self._primes_prefixes, side=self._suspects.take)
        self._shards: dict[int, ShardState] = {}
        self._dead: set[str] = set()
        self._connect_failures: dict[str, int] = {}
        self._in_flight = 0
        self._queued: dict[int, int] = {}  # prompts of each shard still waiting in the queue
        self._fatal: FleetDown | FleetCannotServe | None = None
        self._first = FirstBatchWatch([e.name for e in endpoints], opts.first_batch_relaunches)
        self._broken: BaseException | None = None  # a worker's unexpected exception
        self._rng = random.Random()
        # Servers can leave and join while the run goes on (canary, rolling restart): a
        # retired server takes no new prompt; a re-added one gets fresh workers, and the old
        # workers of that name see a newer generation and exit.
        self._retired: set[str] = set()
        self._generation: dict[str, int] = {e.name: 0 for e in endpoints}
        self._in_flight_by: dict[str, int] = {}
        self._posting = InFlight()  # the HTTP waits open on each server (tasks/hand_back.py)
        self._workers: list[asyncio.Task[None]] = []
        self._stack: contextlib.AsyncExitStack | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.may_revive: Callable[[], bool] = lambda: False  # set by FleetControl.bind

    def _clients(self, endpoints: list[Endpoint]) -> list[tuple[Endpoint, httpx.AsyncClient]]:
        """One (endpoint, client) per worker; a client serves at most POOL_CONNECTIONS workers
        of one server, so its pool never queues and its bookkeeping stays small."""
        limits = httpx.Limits(max_connections=POOL_CONNECTIONS,
                              max_keepalive_connections=POOL_CONNECTIONS)
        timeout = httpx.Timeout(self.opts.request_timeout_s, connect=10.0)
        headers = auth_headers(self.opts.api_key)
        slots: list[tuple[Endpoint, httpx.AsyncClient]] = []
        client: httpx.AsyncClient | None = None
        for ep in endpoints:
            for i in range(ep.limit):
                if client is None or i % POOL_CONNECTIONS == 0:
                    client = httpx.AsyncClient(limits=limits, timeout=timeout, verify=tls_context(),
                                               headers=headers)
                slots.append((ep, client))
        return slots

    async def _start_workers(self, endpoints: list[Endpoint]) -> None:
        assert self._stack is not None
        slots = self._clients(endpoints)
        for client in {id(c): c for _, c in slots}.values():
            await self._stack.enter_async_context(client)
        for ep, client in slots:
            gen = self._generation[ep.name]
            task = asyncio.create_task(self._worker(ep, client, gen))
            task.add_done_callback(self._worker_ended)
            self._workers.append(task)

    def _primes_prefixes(self, name: str) -> bool:
        return any(e.primes_prefixes for e in self.endpoints if e.name == name)

    def _live(self) -> list[Endpoint]:
        return [e for e in self.endpoints if e.name not in self._dead | self._retired]

    def _fleet_down(self) -> bool:
        """No server takes work (dead, or out for a failed restart) and none may come back
        (no restart under way, no relaunch left to try): a wait otherwise."""
        return not self._live() and not self.may_revive()

    def _window(self) -> int:
        """Prompts to keep queued: twice what the live fleet takes at once."""
        return max(2 * sum(e.limit for e in self._live()), 64)

    async def run(self, shards: Shards) -> DispatchStats:
        self.loop = asyncio.get_running_loop()
        async with contextlib.AsyncExitStack() as stack:
            self._stack = stack
            await self._start_workers(self.endpoints)
            feeder = asyncio.create_task(self._feed(shards))
            try:
                while not feeder.done():
                    self._raise_if_failed()
                    await asyncio.sleep(0.02)
                await feeder
                while self._shards and not self.stop.is_set():
                    self._raise_if_failed()
                    if self._fleet_down():
                        raise self._first.all_dead() or FleetDown(
                            f"all {len(self.endpoints)} servers stopped answering "
                            f"({len(self._shards)} shard(s) in flight, not committed)")
                    await asyncio.sleep(0.02)
                if self.stop.is_set():
                    await self._drain(self.drain_timeout_s)
            finally:
                for task in self._workers:
                    task.cancel()
                await asyncio.gather(*self._workers, return_exceptions=True)
                feeder.cancel()
                self._stack = None
        return self.stats

    def _worker_ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None and self._broken is None:
            self._broken = task.exception()

    def _raise_if_failed(self) -> None:
        """A fatal fleet error, or a worker that died of a bug: raise it here rather than
        wait forever for shards no worker will finish (a done-callback records the bug: no
        scan of thousands of workers every 20 ms)."""
        if self._fatal is not None:
            raise self._fatal
        # the disk refused a commit, or a stop signal landed in a worker: the run ends so
        if isinstance(self._broken, RunEnd) or not isinstance(self._broken, Exception | None):
            raise self._broken
        if self._broken is not None:
            raise RuntimeError("a dispatch worker failed") from self._broken

    # --- servers leaving and joining (called on the loop; FleetControl is the thread-safe
    # face) --------------------------------------------------------------------------------

    def retire(self, name: str) -> None:
        """Send `name` no new prompt; what it runs finishes (or fails over when it stops)."""
        self._retired.add(name)

    async def join(self, endpoint: Endpoint) -> None:
        """(Re)admit a server — a restarted one, possibly with a new limit."""
        self._generation[endpoint.name] = self._generation.get(endpoint.name, -1) + 1
        self.endpoints = [e for e in self.endpoints if e.name != endpoint.name] + [endpoint]
        self._retired.discard(endpoint.name)
        self._dead.discard(endpoint.name)
        self._first.joined(endpoint.name)
        self._connect_failures[endpoint.name] = 0
        self._queue.forget(endpoint.name)  # restarted: its prefix cache is empty
        await self._start_workers([endpoint])

    def in_flight_on(self, name: str) -> int:
        return self._in_flight_by.get(name, 0)

    def hand_back(self, name: str) -> int:
        """Give what a retired server still runs to the others now (tasks/hand_back.py)."""
        return self._posting.cancel(name) if name in self._retired else 0

    async def _drain(self, timeout_s: float = 60.0) -> None:
        """Stop taking work; give in-flight requests a bounded time to finish — but only while
        some open shard can still complete (none of its prompts left in the queue): answers
        for a shard that cannot complete would be thrown away anyway."""
        deadline = time.monotonic() + timeout_s
        while self._in_flight and time.monotonic() < deadline:
            if not any(self._queued.get(s, 0) == 0 for s in self._shards):
                return
            await asyncio.sleep(0.02)

    async def _feed(self, shards: Shards) -> None:
        for shard_id, rows in shards:
            while self._queue.qsize() >= self._window() and not self.stop.is_set():
                await asyncio.sleep(0.005)
                if self._fleet_down():
                    return
            if self.stop.is_set():
                return
            n = self.opts.samples
            self._shards[shard_id] = ShardState(size=len(rows) * n)
            for index, row in enumerate(rows):
                for sample in range(n):
                    self._put(WorkItem(shard_id, index * n + sample, row, sample))
            if not rows:
                await self._finish(shard_id)

    def _serves(self, ep: Endpoint, generation: int) -> bool:
        return (ep.name not in self._dead and ep.name not in self._retired
                and self._generation.get(ep.name) == generation)

    async def _worker(self, ep: Endpoint, client: httpx.AsyncClient, generation: int) -> None:
        while self._serves(ep, generation):
            if self.stop.is_set():
                return
            item = await self._queue.get(ep.name)
            if isinstance(item, Primer):
                try:
                    await self._prime(ep, client, item)
                except FleetDown as exc:
                    self._fatal = exc
                    return
                continue
            self._queued[item.shard] -= 1
            if self.stop.is_set() or not self._serves(ep, generation):
                self._put(item)  # stopped, died or left while we waited: hand it on
                return
            self._in_flight += 1
            self._in_flight_by[ep.name] = self._in_flight_by.get(ep.name, 0) + 1
            suspect = self._suspects.started(ep.name, item)
            try:
                await self._handle(ep, client, item)
            except FleetDown as exc:
                self._fatal = exc
                return
            finally:
                self._in_flight -= 1
                self._in_flight_by[ep.name] -= 1
                self._suspects.ended(ep.name, suspect)

    async def _handle(self, ep: Endpoint, client: httpx.AsyncClient, item: WorkItem) -> None:
        refused = unsendable(item.row, self.opts)
        if refused is not None:
            self._queue.done(item)
            await self._record_error(item, refused)
            return
        path, body = self.opts.shapes.build(item.row, self.opts, item.sample)
        started, life = time.monotonic(), self._generation.get(ep.name, 0)
        post = asyncio.ensure_future(self._post(ep, client, path, body))
        self._posting.track(ep.name, post)
        try:
            answer = await post
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the run is stopping, not a hand-back
            self.stats.handed_back += 1
            self._put(item)  # handed back (hand_back): another server answers it
            return
        except PermanentFailure as exc:
            self._queue.done(item)
            await self._record_error(item, str(exc))
            return
        except TransientFailure as exc:
            # a refused connection reached no server: no try used (a fleet that refuses all
            # is FleetDown); counted, a relaunch window ended innocent prompts as errors
            if not exc.connect:
                item.attempts += 1
            item.last_error = str(exc)
            self.stats.retries += 1
            # a server stopped on purpose (retired) killed nothing
            if exc.lost and ep.name not in self._retired and await self._deaths.died(
                    client, ep.name, ep.url, life):
                item.killed.append(ep.name)
                if not self._first.blames_rows(ep.name):  # a fleet that answered nothing
                    self._fatal = self._fatal or self._first.died(  # quarantines no row
                        ep.name, self._generation[ep.name])
                else:
                    reason = quarantined(item)
                    if reason is not None:
                        self._queue.done(item)
                        await self._record_error(item, reason)
                        return
            if exc.connect:
                fails = self._connect_failures.get(ep.name, 0) + 1
                self._connect_failures[ep.name] = fails
                if fails >= DEAD_AFTER_CONNECT_FAILURES and ep.name not in self._dead:
                    self._dead.add(ep.name)
                    log.warning("%s: %d connection failures in a row, taken out of dispatch "
                                "(%s)", ep.name, fails, exc)
            if item.attempts >= self.opts.max_attempts:
                self._queue.done(item)
                await self._record_error(
                    item, f"failed {item.attempts} times; last: {item.last_error}")
                return
            delay = self.opts.backoff_s * (2 ** (item.attempts - 1))
            await asyncio.sleep(min(delay, 30.0) * (0.5 + self._rng.random()))
            self._put(item)
            return
        self._connect_failures[ep.name] = 0
        self._first.answer(ep.name)
        self._queue.done(item)
        row = output_row(item.row, self.opts, answer, Delivery(
            item.sample, body, ep.name, ep.fingerprint, ep.version, time.monotonic() - started))
        shard = self._shards[item.shard]
        shard.results[item.index] = row
        self.stats.completed += 1
        self.stats.output_tokens += answer["completion_tokens"]
        if shard.done:
            await self._finish(item.shard)

    async def _prime(self, ep: Endpoint, client: httpx.AsyncClient, primer: Primer) -> None:
        """Send a group's shared prefix for one token, so the server caches it where the
        group's prompts branch off. It is no prompt of the job: whatever the answer, the
        group then goes on (a failed primer costs only the reuse)."""
        path, body = self.opts.shapes.build(primer.row, replace(self.opts, sampling={
            "max_new_tokens": 1, "temperature": 0.0, "top_p": 1.0}))
        try:
            await self._post(ep, client, path, body)
        except (PermanentFailure, TransientFailure) as exc:
            log.info("%s: a prefix primer failed (%s); its group goes on without it",
                     ep.name, exc)
        finally:
            self._queue.done(primer)
            self.stats.primers += 1

    def _put(self, item: WorkItem) -> None:
        self._queued[item.shard] = self._queued.get(item.shard, 0) + 1
        (self._suspects.hold if item.killed else self._queue.put)(item)

    async def _post(self, ep: Endpoint, client: httpx.AsyncClient, path: str,
                    body: dict[str, Any]) -> Answer:
        try:
            resp = await client.post(f"{ep.url}{path}", content=json.dumps(body),
                                           headers={"Content-Type": "application/json"})
        except httpx.ConnectError as exc:
            raise TransientFailure(f"{ep.name}: cannot connect ({exc})", connect=True) from exc
        except httpx.TimeoutException as exc:
            raise TransientFailure(f"{ep.name}: {type(exc).__name__}: {exc}") from exc
        except (httpx.NetworkError, httpx.RemoteProtocolError) as exc:  # broke mid-request
            raise TransientFailure(f"{ep.name}: {type(exc).__name__}: {exc}", lost=True) from exc
        if resp.status_code == 401:
            raise FleetDown(f"{ep.url}{path}: 401 Unauthorized; set api_key to the servers' "
                            "--api-key")
        if resp.status_code >= 500 or resp.status_code == 429:
            raise TransientFailure(f"{ep.name}: HTTP {resp.status_code}")
        if resp.status_code >= 400:
            raise PermanentFailure(f"HTTP {resp.status_code}: {self.opts.shapes.refusal(resp)}")
        try:
            return self.opts.shapes.parse(path, resp.json())
        except ValueError as exc:
            raise TransientFailure(f"{ep.name}: answer is not JSON") from exc
        except MalformedAnswer as exc:
            raise TransientFailure(f"{ep.name}: {exc}") from exc

    async def _record_error(self, item: WorkItem, reason: str) -> None:
        shard = self._shards[item.shard]
        shard.errors[item.index] = dict(ErrorRow(id=item.row.id, sample_index=item.sample,
                                                 error=reason, attempts=item.attempts + 1))
        self.stats.errors += 1
        if shard.done:
            await self._finish(item.shard)

    async def _finish(self, shard_id: int) -> None:
        shard = self._shards[shard_id]
        rows = [shard.results[i] for i in sorted(shard.results)]
        errors = [shard.errors[i] for i in sorted(shard.errors)]
        await self.commit(shard_id, rows, errors)
        del self._shards[shard_id]

