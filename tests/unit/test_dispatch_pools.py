"""The dispatcher never puts many connections in one httpx pool (its bookkeeping is quadratic)."""

from __future__ import annotations

import asyncio
from collections import Counter

from tasks.dispatch import POOL_CONNECTIONS, Dispatcher, DispatchOptions, Endpoint

OPTS = DispatchOptions("m", None, {"max_new_tokens": 8, "temperature": 0.7, "top_p": 0.9,
                                   "seed": 1}, 30.0, 3, 0.01)


async def _noop(shard: int, rows: list, errors: list) -> None:
    return None


def test_workers_are_spread_over_small_per_server_clients() -> None:
    endpoints = [Endpoint("a", "http://127.0.0.1:1", 40, "c"),
                 Endpoint("b", "http://127.0.0.1:2", 5, "c")]
    slots = Dispatcher(endpoints, OPTS, _noop)._clients(endpoints)
    try:
        assert [ep.name for ep, _ in slots].count("a") == 40
        assert [ep.name for ep, _ in slots].count("b") == 5
        workers_per_client = Counter(id(client) for _, client in slots)
        assert max(workers_per_client.values()) <= POOL_CONNECTIONS
        assert len(workers_per_client) == 3 + 1  # ceil(40/16) for a, one for b
        servers_per_client: dict[int, set[str]] = {}
        for ep, client in slots:
            servers_per_client.setdefault(id(client), set()).add(ep.name)
        assert all(len(names) == 1 for names in servers_per_client.values())
    finally:
        async def close() -> None:
            for client in {id(c): c for _, c in slots}.values():
                await client.aclose()
        asyncio.run(close())
