"""Servers leave and join a running dispatch (the canary's and the rolling restart's move)
without losing or duplicating a prompt, and a retired server gets nothing new."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from tasks.dispatch import Dispatcher, Endpoint
from tasks.fleet_control import DispatchEnded, FleetControl
from tests.integration.test_dispatch import OPTS, endpoints, shards


def run_beside(operate: Callable[[], None],
               main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """The dispatch on this thread's loop; `operate` (retire, join) on another, as the
    tuning watch does."""
    worker = threading.Thread(target=operate)
    worker.start()
    asyncio.run(main())
    worker.join()


def test_retired_server_takes_nothing_new_and_rejoins_with_a_new_limit(sim_fleet) -> None:
    handles = sim_fleet(2, **{"sim.time_scale": 5.0, "sampling.max_new_tokens": 32})
    eps = endpoints(handles, limit=4)
    control = FleetControl()
    committed: dict[int, list] = {}
    seen_while_out: list[str] = []
    phase = {"out": False}

    async def commit(shard: int, rows: list, errors: list) -> None:
        assert shard not in committed, "a shard was committed twice"
        committed[shard] = rows

    def operate() -> None:
        while not control.running:
            time.sleep(0.01)
        time.sleep(0.3)
        control.retire("server-1")
        assert control.wait_drained("server-1", 10.0) == 0
        phase["out"] = True
        time.sleep(0.5)
        phase["out"] = False
        control.join(Endpoint("server-1", handles[1].url, 9, "new-config"))

    async def main() -> None:
        d = Dispatcher(eps, OPTS, commit)
        control.bind(d)
        original = d._handle

        async def spy(ep, client, item):
            if phase["out"] and ep.name == "server-1":
                seen_while_out.append(item.row["id"])
            await original(ep, client, item)

        d._handle = spy  # type: ignore[method-assign]
        try:
            await d.run(iter(shards(12, 20)))
        finally:
            control.unbind()

    run_beside(operate, main)
    ids = sorted(r["id"] for rows in committed.values() for r in rows)
    assert ids == sorted(f"s{s}-{i}" for s in range(12) for i in range(20))
    assert seen_while_out == []
    configs = {r["config"] for rows in committed.values() for r in rows
               if r["server"] == "server-1"}
    assert "new-config" in configs  # it came back and served under its new config
    with pytest.raises(DispatchEnded):
        control.retire("server-0")  # the dispatch is over: nothing to control


def test_a_retired_servers_long_answers_are_handed_back_and_it_stops_at_once(
        sim_fleet, tmp_path) -> None:
    """After the drain timeout, what a retired server still runs goes back to the queue and
    the other server answers it, each prompt once; the retired server, its clients gone, has
    nothing left to generate and exits at SIGTERM at once (it used to generate every
    in-flight answer until the 30 s grace ran out: a canary restart with long answers was
    34 s out of dispatch, and the rollout's payback rule then refused it)."""
    from dataclasses import replace

    from tasks.local_servers import registry_for, stop_one

    handles = sim_fleet(2, **{"sim.time_scale": 10.0})
    opts = replace(OPTS, sampling={"max_new_tokens": 1200, "temperature": 0.7, "top_p": 0.9,
                                   "seed": 1, "ignore_eos": True})
    control = FleetControl()
    committed: dict[int, list] = {}
    outcome: dict[str, float] = {}

    async def commit(shard: int, rows: list, errors: list) -> None:
        assert shard not in committed and not errors
        committed[shard] = rows

    def operate() -> None:
        while not control.running:
            time.sleep(0.01)
        time.sleep(1.0)  # both servers mid-answer
        control.retire("server-1")
        began = time.monotonic()
        outcome["handed_back"] = control.wait_drained("server-1", 0.5)
        outcome["drained_s"] = time.monotonic() - began
        began = time.monotonic()
        stop_one(handles[1], registry_for(tmp_path / "out"), 30.0)
        outcome["stop_s"] = time.monotonic() - began

    async def main() -> None:
        d = Dispatcher(endpoints(handles, limit=3)[:2], opts, commit)
        control.bind(d)
        try:
            stats = await d.run(iter(shards(2, 3)))
            outcome["stats_handed_back"] = stats.handed_back
        finally:
            control.unbind()

    run_beside(operate, main)
    rows = [r for shard in committed.values() for r in shard]
    assert sorted(r["id"] for r in rows) == sorted(f"s{s}-{i}" for s in range(2) for i in range(3))
    assert outcome["handed_back"] == 3 == outcome["stats_handed_back"]
    assert outcome["drained_s"] < 3.0 and outcome["stop_s"] < 10.0
    assert {r["server"] for r in rows} == {"server-0"}  # server-1 finished none of its three
    assert all(r["completion_tokens"] == 1200 for r in rows)
