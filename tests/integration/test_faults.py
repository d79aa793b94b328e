"""The fault matrix: each fault ends with every prompt done once, or a clear error."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from infra.prompt_row import PromptRow
from tasks.dispatch import Dispatcher, DispatchOptions, Endpoint
from tasks.health import ServerStartFailed, wait_until_healthy
from tasks.run_ends import FleetDown


def opts(**changes: object) -> DispatchOptions:
    base: dict[str, object] = {
        "model": "m", "api_key": None,
        "sampling": {"max_new_tokens": 8, "temperature": 0.7, "top_p": 0.9, "seed": 1},
        "request_timeout_s": 30.0, "max_attempts": 6, "backoff_s": 0.01}
    base.update(changes)
    return DispatchOptions(**base)  # type: ignore[arg-type]


def run(endpoints: list[Endpoint], n: int, options: DispatchOptions) -> dict[int, tuple]:
    committed: dict[int, tuple] = {}

    async def commit(shard: int, rows: list, errors: list) -> None:
        assert shard not in committed
        committed[shard] = (rows, errors)

    work = [(s, [PromptRow(f"{s}-{i}", prompt=f"p {s} {i}") for i in range(10)])
            for s in range(n)]
    asyncio.run(Dispatcher(endpoints, options, commit).run(iter(work)))
    return committed


def ids(committed: dict[int, tuple]) -> list[str]:
    return sorted(r["id"] for rows, _ in committed.values() for r in rows)


def test_hung_requests_time_out_and_go_elsewhere(sim_fleet) -> None:
    handles = sim_fleet(2, **{"sim.faults": {"hang_rate": 0.1}})
    eps = [Endpoint(f"s{h.index}", h.url, 4, "c") for h in handles]
    committed = run(eps, 4, opts(request_timeout_s=1.0))
    assert len(ids(committed)) == 40 and len(set(ids(committed))) == 40


def test_wrong_api_key_is_one_clear_error(sim_fleet) -> None:
    handles = sim_fleet(1, api_key="right")
    eps = [Endpoint("s0", handles[0].url, 2, "c")]
    with pytest.raises(FleetDown, match="401 Unauthorized; set api_key"):
        run(eps, 1, opts(api_key="wrong"))


def test_a_fleet_that_dies_is_a_clear_error_and_loses_no_commit(sim_fleet) -> None:
    handles = sim_fleet(1, **{"sim.faults": {"crash_after_requests": 25}})
    eps = [Endpoint("s0", handles[0].url, 2, "c")]
    committed: dict[int, tuple] = {}

    async def commit(shard: int, rows: list, errors: list) -> None:
        committed[shard] = (rows, errors)

    work = [(s, [PromptRow(f"{s}-{i}", prompt="p") for i in range(10)]) for s in range(5)]
    with pytest.raises(FleetDown, match="stopped answering"):
        asyncio.run(Dispatcher(eps, opts(), commit).run(iter(work)))
    assert 1 <= len(committed) <= 3
    assert all(len(rows) == 10 for rows, _ in committed.values())  # whole shards only


def test_slow_start_beyond_the_deadline_names_the_setting(sim_fleet) -> None:
    handles = sim_fleet(1, wait=False, **{"sim.faults": {"start_delay_s": 30}})
    with pytest.raises(ServerStartFailed, match="startup_timeout_s"):
        wait_until_healthy(handles, None, timeout_s=2.0)


def test_malformed_answers_are_retried_then_recorded(tmp_path: Path) -> None:
    """A server answering 200 with a body that is not SGLang's: retried, then an error row."""
    import socket
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class Bad(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            body = b'{"unexpected": true}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            return

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = HTTPServer(("127.0.0.1", port), Bad)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        committed = run([Endpoint("bad", f"http://127.0.0.1:{port}", 2, "c")], 1,
                        opts(max_attempts=2))
    finally:
        server.shutdown()
    rows, errors = committed[0]
    assert rows == [] and len(errors) == 10
    assert "malformed answer" in errors[0]["error"]


def test_connection_resets_are_retried(sim_fleet) -> None:
    import httpx

    handles = sim_fleet(2, **{"sim.faults": {"reset_rate": 0.2}})
    with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
        for _ in range(50):  # a reset is a dropped connection, not an HTTP answer
            httpx.post(f"{handles[0].url}/generate", json={"text": "x"}, timeout=10)
    eps = [Endpoint(f"s{h.index}", h.url, 4, "c") for h in handles]
    committed = run(eps, 4, opts())
    assert len(ids(committed)) == 40 and len(set(ids(committed))) == 40


def test_a_refused_connection_uses_no_try(sim_fleet) -> None:
    """A server that refuses connections (relaunching, or gone) never saw the prompt: with
    one try a prompt, every prompt still ends answered by the server that serves. Counted
    as tries, such refusals ended innocent prompts as "failed 5 times … cannot connect"
    while a relaunch was under way (bench/suspect_lane.py)."""
    import socket

    (good,) = sim_fleet(1)
    with socket.socket() as s:  # a port nobody listens on: connections are refused
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    committed = run([Endpoint("gone", f"http://127.0.0.1:{closed}", 8, "c"),
                     Endpoint("server-0", good.url, 8, good.fingerprint)], 4,
                    opts(max_attempts=1))
    assert ids(committed) == sorted(f"{s}-{i}" for s in range(4) for i in range(10))
    assert all(not errors for _, errors in committed.values())
