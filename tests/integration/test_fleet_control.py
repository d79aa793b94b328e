"""Servers leave and join a running dispatch (the canary's and the rolling restart's move)
without losing or duplicating a prompt, and a retired server gets nothing new."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from tasks.dispatch import Dispatcher, Endpoint
from tasks.fleet_control import DispatchEnded, FleetControl
from tests.integration.test_dispatch import OPTS, endpoints, shards


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

    worker = threading.Thread(target=operate)
    worker.start()
    asyncio.run(main())
    worker.join()
    ids = sorted(r["id"] for rows in committed.values() for r in rows)
    assert ids == sorted(f"s{s}-{i}" for s in range(12) for i in range(20))
    assert seen_while_out == []
    configs = {r["config"] for rows in committed.values() for r in rows
               if r["server"] == "server-1"}
    assert "new-config" in configs  # it came back and served under its new config
    with pytest.raises(DispatchEnded):
        control.retire("server-0")  # the dispatch is over: nothing to control
