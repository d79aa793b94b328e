"""The scheduler's running batch, kept so that every question a turn asks costs O(log n).

Every turn asks the batch for its KV tokens, what it is expected to still write, the fewest
tokens any request has left, and advances every request by the same number of tokens. Since
all running requests advance together, one counter says how far: a member that joined at
counter `G₀` having written `g₀` has written `G − (G₀ − g₀)` now (up to its target). So the
batch keeps `G`, each member's start `G₀ − g₀`, and sums of those; a heap of finish points
(start + target) gives the next completion, and a heap of clip points (start + limit − 4,096,
where SGLang stops clipping a request's reservation) keeps the reservation's sum exact. A turn
then costs the same at any cap and any number of requests: a plan replays ~10⁴ requests per
alternative (infra/sim/predict.py), and per-request passes over the batch were most of it.

Lengths are real numbers (MTP writes `accept_len` tokens a step on average); KV tokens held
are the floor of the batch's total. `SimRequest.generated` is written back (`sync`) when a
request leaves the batch or the scheduler needs the objects themselves (retraction).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator
from dataclasses import dataclass

from infra.sim.sim_request import CLIP_MAX_NEW_TOKENS, SimRequest


@dataclass
class _Member:
    seq: int  # admission order
    req: SimRequest
    start: float  # the counter's value when this request had written nothing
    target: float
    limit: float  # what SGLang reserves against: max_new_tokens, else the target
    clipped: bool  # reserving CLIP_MAX_NEW_TOKENS (more than that left to its limit)


class RunningSet:
    def __init__(self, reqs: list[SimRequest] | None = None) -> None:
        self._counter = 0.0
        self._members: dict[int, _Member] = {}  # by admission sequence: insertion order
        self._seq = 0
        self._finish: list[tuple[float, int]] = []  # (start + target, seq)
        self._clip: list[tuple[float, int]] = []  # (start + limit − clip, seq), clipped ones
        self._prompt_sum = 0.0
        self._start_sum = 0.0
        self._unclipped_n = 0
        self._unclipped_end_sum = 0.0  # start + limit of the unclipped members
        self._finished: list[_Member] = []  # reached their target in the last advance
        self.served = 0  # requests with a client
        for req in reqs or []:
            self.append(req)

    def __len__(self) -> int:
        return len(self._members)

    def __bool__(self) -> bool:
        return bool(self._members)

    def __iter__(self) -> Iterator[SimRequest]:
        self.sync()
        return iter([m.req for m in self._members.values()])

    def append(self, req: SimRequest) -> None:
        seq, self._seq = self._seq, self._seq + 1
        start = self._counter - req.generated
        limit = float(req.max_new_tokens or req.target_tokens)
        member = _Member(seq, req, start, float(req.target_tokens), limit, clipped=True)
        self._members[seq] = member
        heapq.heappush(self._finish, (start + member.target, seq))
        heapq.heappush(self._clip, (start + limit - CLIP_MAX_NEW_TOKENS, seq))
        self._prompt_sum += req.prompt_tokens
        self._start_sum += start
        self.served += req.future is not None

    def _generated(self, member: _Member) -> float:
        return min(self._counter - member.start, member.target)

    def sync(self) -> None:
        """Write the lengths back to the request objects."""
        for member in self._members.values():
            member.req.generated = self._generated(member)

    def generated_total(self) -> float:
        return len(self._members) * self._counter - self._start_sum

    def kv_used(self) -> int:
        """KV tokens held: the prompts plus the whole tokens written."""
        return int(self._prompt_sum + self.generated_total())

    def reserve_total(self) -> int:
        """What SGLang expects the batch may still write, each request clipped at
        CLIP_MAX_NEW_TOKENS (before the new-token ratio): SimRequest.reserve summed."""
        clip = self._clip
        while clip and clip[0][0] <= self._counter:
            _, seq = heapq.heappop(clip)
            member = self._members.get(seq)
            if member is not None:  # still running: from now on it reserves what it has left
                member.clipped = False
                self._unclipped_n += 1
                self._unclipped_end_sum += member.start + member.limit
        clipped = len(self._members) - self._unclipped_n
        left = self._unclipped_end_sum - self._unclipped_n * self._counter
        return int(clipped * CLIP_MAX_NEW_TOKENS + left)

    def fewest_left(self) -> float:
        """Tokens the request nearest its target has left (inf: none runs)."""
        finish = self._finish
        while finish and finish[0][1] not in self._members:  # left the batch some other way
            heapq.heappop(finish)
        return finish[0][0] - self._counter if finish else math.inf

    def just_admitted(self) -> int:
        return sum(self._generated(m) == 0 for m in self._members.values())

    def advance(self, tokens: float) -> float:
        """Every request writes `tokens` more (none past its target); the tokens written.
        Those that reach their target wait for `take_finished`."""
        counter = self._counter + tokens
        produced = len(self._members) * tokens
        finish = self._finish
        while finish and finish[0][0] <= counter:
            end, seq = heapq.heappop(finish)
            member = self._members.get(seq)
            if member is not None:
                produced -= counter - max(end, self._counter)
                self._finished.append(member)
        self._counter = counter
        return produced

    def take_finished(self) -> list[SimRequest]:
        """The requests that reached their target, out of the batch (in batch order, their
        lengths written back)."""
        if not self._finished:
            return []
        done = sorted(self._finished, key=lambda m: m.seq)
        self._finished = []
        for member in done:
            member.req.generated = member.target
            self._remove(member)
        return [m.req for m in done]

    def drop(self, gone: list[SimRequest]) -> None:
        """Take these requests out of the batch (their clients went away)."""
        if gone:
            ids = {id(r) for r in gone}
            for member in [m for m in self._members.values() if id(m.req) in ids]:
                member.req.generated = self._generated(member)
                self._remove(member)

    def _remove(self, member: _Member) -> None:
        """Out of the batch and its sums; its heap entries are skipped when they surface."""
        del self._members[member.seq]
        self._prompt_sum -= member.req.prompt_tokens
        self._start_sum -= member.start
        self.served -= member.req.future is not None
        if not member.clipped:
            self._unclipped_n -= 1
            self._unclipped_end_sum -= member.start + member.limit

    def abandoned(self) -> list[SimRequest]:
        """Requests whose client went away (only served requests have one)."""
        return ([m.req for m in self._members.values() if m.req.abandoned()] if self.served
                else [])
