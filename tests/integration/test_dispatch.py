"""The dispatcher survives 5xx, dead servers and permanent failures without losing a prompt."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import pytest
from prefect.exceptions import TerminationSignal

from infra.prompt_row import PromptRow
from tasks.dispatch import Dispatcher, DispatchOptions, Endpoint
from tasks.requests import build_request

OPTS = DispatchOptions(model="m", api_key=None,
                       sampling={"max_new_tokens": 16, "temperature": 0.7, "top_p": 0.9,
                                 "seed": 1},
                       request_timeout_s=30, max_attempts=8, backoff_s=0.01)


def shards(n_shards: int, size: int,
           long_ids: frozenset[str] | set[str] = frozenset()) -> list[tuple[int, list[PromptRow]]]:
    out = []
    for s in range(n_shards):
        rows: list[PromptRow] = []
        for i in range(size):
            rid = f"s{s}-{i}"
            rows.append(PromptRow(rid, prompt=("word " * 500) if rid in long_ids else f"q {rid}"))
        out.append((s, rows))
    return out


def run(endpoints: list[Endpoint], work: list, on_kill: Any = None) -> tuple[dict, Any]:
    committed: dict[int, tuple[list, list]] = {}

    async def commit(shard: int, rows: list, errors: list) -> None:
        assert shard not in committed, "a shard was committed twice"
        committed[shard] = (rows, errors)
        if on_kill is not None and len(committed) == 1:
            on_kill()

    stats = asyncio.run(Dispatcher(endpoints, OPTS, commit).run(iter(work)))
    return committed, stats


def endpoints(handles: list, limit: int = 8) -> list[Endpoint]:
    return [Endpoint(f"server-{h.index}", h.url, limit, h.fingerprint) for h in handles]


def test_every_prompt_once_with_5xx_faults(sim_fleet) -> None:
    handles = sim_fleet(2, **{"sim.faults": {"error_rate": 0.2}})
    committed, stats = run(endpoints(handles), shards(6, 20))
    ids = [r["id"] for rows, _ in committed.values() for r in rows]
    assert sorted(ids) == sorted(f"s{s}-{i}" for s in range(6) for i in range(20))
    assert stats.retries > 0 and stats.errors == 0
    assert {r["server"] for rows, _ in committed.values() for r in rows} == {
        "server-0", "server-1"}


def test_too_long_prompt_goes_to_errors_and_job_goes_on(sim_fleet) -> None:
    handles = sim_fleet(1, **{"server.context_length": 256})
    committed, stats = run(endpoints(handles), shards(2, 5, long_ids={"s1-2"}))
    rows, errors = committed[1]
    assert [e["id"] for e in errors] == ["s1-2"]
    assert "HTTP 400" in errors[0]["error"] and "context length" in errors[0]["error"]
    assert len(rows) == 4 and stats.completed == 9


def test_a_server_killed_mid_run_loses_nothing(sim_fleet) -> None:
    handles = sim_fleet(2, **{"sim.time_scale": 50.0, "sampling.max_new_tokens": 64})
    victim = handles[1].record.pid
    committed, stats = run(endpoints(handles), shards(8, 20),
                           on_kill=lambda: os.kill(victim, signal.SIGKILL))
    ids = sorted(r["id"] for rows, _ in committed.values() for r in rows)
    assert ids == sorted(f"s{s}-{i}" for s in range(8) for i in range(20))
    assert stats.errors == 0


def test_per_row_sampling_overrides_defaults() -> None:
    path, body = build_request(PromptRow("a", prompt="x", max_new_tokens=5), OPTS)
    assert path == "/generate" and body["sampling_params"]["max_new_tokens"] == 5
    assert body["sampling_params"]["sampling_seed"] == 1
    path, body = build_request(
        PromptRow("a", messages=[{"role": "user", "content": "x"}]), OPTS)
    assert path == "/v1/chat/completions" and body["max_tokens"] == 16


def test_a_stop_signal_that_lands_in_a_worker_ends_the_run_as_that_signal(sim_fleet) -> None:
    """Prefect's TerminationSignal raised inside a worker stays in that worker's task; the
    dispatcher ends with it, not with "a dispatch worker failed" (the flow is then marked
    Crashed by a termination signal and its fleet stopped, as for one that landed anywhere
    else)."""
    handles = sim_fleet(1)

    def terminate() -> None:
        raise TerminationSignal(signal=signal.SIGTERM)

    with pytest.raises(TerminationSignal):
        run(endpoints(handles), shards(3, 5), on_kill=terminate)


def test_a_killer_among_many_running_prompts_is_quarantined_and_nothing_else_lost(
        sim_fleet) -> None:
    """200 prompts on 3 servers taking 64 each: the first death implicates everything its
    server ran, one /health verdict for all of them (a late check must not find the relaunch
    alive and let the killer off); they run again one per server, and the killer is
    quarantined at its second death; every other prompt is answered once."""
    handles = sim_fleet(3, **{"sim.time_scale": 50.0, "sampling.max_new_tokens": 64,
                              "sim.faults": {"crash_on_text": "POISON"}})
    work = shards(4, 50)
    poison = work[2][1][7]
    work[2][1][7] = PromptRow(poison.id, prompt="POISON pill")
    committed, _ = run(endpoints(handles, limit=64), work)
    answered = sorted(str(r["id"]) for rows, _ in committed.values() for r in rows)
    assert answered == sorted(str(r.id) for _, rows in work for r in rows if r.id != poison.id)
    errors = [e for _, errs in committed.values() for e in errs]
    assert [e["id"] for e in errors] == [poison.id]
    assert errors[0]["error"].startswith("killed the server twice"), errors[0]["error"]
