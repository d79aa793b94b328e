"""The scheduler's running batch: its requests in admission order, with their lengths as
arrays.

Every turn asks the batch for its KV tokens, what it is expected to still write, the fewest
tokens any request has left, and advances every request by the same number of tokens. As
Python loops over the requests those were O(batch) each, so a replay cost grew with the cap
times the requests: at a cap of ~400 (a small hybrid on an H200) a plan took ten seconds. As
vector operations a turn costs about the same at any cap. The arrays are the truth for the
running requests' lengths; `SimRequest.generated` is written back (`sync`) when a request
leaves the batch or the scheduler needs the objects themselves (retraction).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from infra.sim.sim_request import CLIP_MAX_NEW_TOKENS, SimRequest

GEN, TARGET, PROMPT, LIMIT = range(4)  # the columns of RunningSet's lengths


class RunningSet:
    def __init__(self, reqs: list[SimRequest] | None = None) -> None:
        reqs = reqs or []
        self.n = len(reqs)
        size = max(16, 2 * self.n)
        self._objs = np.empty(size, dtype=object)  # object array: masks in C
        self._objs[:self.n] = reqs
        self._lens = np.zeros((size, 4))  # gen, target, prompt, limit: whole numbers exact
        for i, req in enumerate(reqs):
            self._lens[i] = self._row(req)
        self.served = sum(r.future is not None for r in reqs)  # requests with a client
        self._kv: int | None = None  # kv_used, until the lengths or the members change

    @staticmethod
    def _row(req: SimRequest) -> tuple[float, float, float, float]:
        return (req.generated, req.target_tokens, req.prompt_tokens,
                req.max_new_tokens or req.target_tokens)

    @property
    def gen(self) -> np.ndarray:
        return self._lens[:self.n, GEN]

    def _col(self, column: int) -> np.ndarray:
        return self._lens[:self.n, column]

    def __len__(self) -> int:
        return self.n

    def __bool__(self) -> bool:
        return self.n > 0

    def __iter__(self) -> Iterator[SimRequest]:
        self.sync()
        return iter(self._objs[:self.n].tolist())

    def append(self, req: SimRequest) -> None:
        if self.n == len(self._objs):  # grow: amortized O(1) appends
            self._objs = np.concatenate([self._objs, np.empty(self.n, dtype=object)])
            self._lens = np.concatenate([self._lens, np.zeros((self.n, 4))])
        self._objs[self.n] = req
        self._lens[self.n] = self._row(req)
        self.n += 1
        self.served += req.future is not None
        if self._kv is not None:
            self._kv += req.prompt_tokens + int(req.generated)

    def sync(self) -> None:
        """Write the lengths back to the request objects."""
        for req, generated in zip(self._objs[:self.n].tolist(), self.gen.tolist(), strict=True):
            req.generated = generated

    def kv_used(self) -> int:
        """KV tokens held: each prompt plus the whole tokens it has written."""
        if self._kv is None:
            self._kv = int(self._col(PROMPT).sum() + np.floor(self.gen).sum())
        return self._kv

    def generated_total(self) -> int:
        return int(np.floor(self.gen).sum())

    def reserve_total(self) -> int:
        """What SGLang expects the batch may still write, each request clipped (before the
        new-token ratio): SimRequest.reserve summed."""
        return int(np.minimum(self._col(LIMIT) - np.floor(self.gen),
                              CLIP_MAX_NEW_TOKENS).sum())

    def fewest_left(self) -> float:
        return float((self._col(TARGET) - self.gen).min())

    def just_admitted(self) -> int:
        return int((self.gen == 0).sum())

    def advance(self, tokens: float) -> float:
        """Every request writes `tokens` more (none past its target); the tokens written."""
        gen = self.gen
        new = np.minimum(gen + tokens, self._col(TARGET))
        produced = float((new - gen).sum())
        gen[:] = new
        self._kv = None
        return produced

    def take_finished(self) -> list[SimRequest]:
        """The requests that reached their target, out of the batch (in batch order, their
        lengths written back)."""
        finished = self.gen >= self._col(TARGET)
        if not finished.any():
            return []
        done: list[SimRequest] = self._objs[:self.n][finished].tolist()
        for req in done:
            req.generated = float(req.target_tokens)
        self._keep(~finished)
        return done

    def drop(self, gone: list[SimRequest]) -> None:
        """Take these requests out of the batch (their clients went away)."""
        if not gone:
            return
        ids = {id(r) for r in gone}
        self._keep(np.array([id(r) not in ids for r in self._objs[:self.n].tolist()],
                            dtype=bool))

    def _keep(self, keep: np.ndarray) -> None:
        objs = self._objs[:self.n]
        if self.served:
            self.served -= sum(r.future is not None for r in objs[~keep].tolist())
        kept = int(keep.sum())
        self._objs[:kept] = objs[keep]
        self._objs[kept:self.n] = None
        self._lens[:kept] = self._lens[:self.n][keep]
        self.n = kept
        self._kv = None

    def abandoned(self) -> list[SimRequest]:
        """Requests whose client went away (only served requests have one)."""
        return ([r for r in self._objs[:self.n].tolist() if r.abandoned()] if self.served
                else [])
