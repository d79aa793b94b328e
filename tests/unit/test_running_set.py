"""The running batch's sums, kept in O(log n) a turn, against the same figures computed over
every request (what SimRequest says each one holds and reserves)."""

from __future__ import annotations

import random

import pytest

from infra.sim.running_set import RunningSet
from infra.sim.sim_request import SimRequest


def _request(rng: random.Random, generated: float = 0.0) -> SimRequest:
    target = rng.choice([rng.randint(1, 300), rng.randint(3000, 9000)])
    limit = rng.choice([0, target, target + rng.randint(1, 6000)])
    return SimRequest(rng.randint(1, 2000), target, None, generated=min(generated, target - 1),
                      max_new_tokens=limit)


def _naive(reqs: list[SimRequest]) -> tuple[int, int, float]:
    """(KV tokens held, reservation, fewest left) from the objects themselves."""
    kv = sum(r.prompt_tokens + r.generated for r in reqs)
    return int(kv), sum(r.reserve() for r in reqs), min(r.target_tokens - r.generated
                                                        for r in reqs)


@pytest.mark.parametrize("step", [1.0, 2.5])  # whole tokens a step, and MTP's mean
@pytest.mark.parametrize("seed", range(4))
def test_the_kept_sums_are_what_the_requests_hold(seed: int, step: float) -> None:
    rng = random.Random(seed)
    batch = RunningSet([_request(rng, generated=rng.randint(0, 50)) for _ in range(20)])
    members = list(batch)
    for _ in range(400):
        action = rng.random()
        if action < 0.3 or not members:
            req = _request(rng)
            batch.append(req)
            members.append(req)
        elif action < 0.35 and len(members) > 1:
            gone = rng.sample(members, 2)
            batch.drop(gone)
            members = [m for m in members if all(m is not g for g in gone)]
        else:
            fewest = batch.fewest_left()
            steps = max(1, min(int(fewest // step) + 1, rng.randint(1, 200)))
            list(batch)  # writes the lengths back
            before = {id(m): m.generated for m in members}
            produced = batch.advance(steps * step)
            done = batch.take_finished()
            expected = sum(min(before[id(m)] + steps * step, m.target_tokens) - before[id(m)]
                           for m in members)
            assert produced == pytest.approx(expected)
            assert all(r.generated == r.target_tokens for r in done)
            done_ids = {id(r) for r in done}
            assert [id(r) for r in done] == [id(m) for m in members if id(m) in done_ids]
            members = [m for m in members if id(m) not in done_ids]
        if not members:
            continue
        list(batch)
        kv, reserve, fewest = _naive(members)
        assert len(batch) == len(members)
        assert abs(batch.kv_used() - kv) <= 1  # the floor of the total, of each when whole
        assert batch.reserve_total() == pytest.approx(reserve, abs=len(members))
        if step == 1.0:
            assert batch.reserve_total() == reserve
            assert batch.kv_used() == kv
        assert batch.fewest_left() == pytest.approx(fewest)
