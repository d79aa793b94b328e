"""Launch/stop: real processes, real signals, stale servers of a dead run, foreign ports."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from infra.processes import ProcessRecord, ProcessRegistry, is_alive, port_is_free
from tasks.engines import build_engine
from tasks.local_servers import LaunchError, launch_fleet, registry_for, stop_fleet
from tests.conftest import sim_settings


def test_stop_verifies_processes_gone_and_ports_free(sim_fleet, tmp_path: Path) -> None:
    handles = sim_fleet(2)
    report = stop_fleet(handles, registry_for(tmp_path / "out"), 5.0)
    assert report.stopped == 2 and report.ports_busy == []
    for h in handles:
        assert not is_alive(h.record.pid)
        assert port_is_free("127.0.0.1", h.record.port)
    assert not (tmp_path / "out" / "servers" / "registry.json").exists()


def test_rerun_stops_servers_left_by_a_dead_run(tmp_path: Path) -> None:
    settings = sim_settings(tmp_path, 1)
    out = Path(settings.output)
    first = launch_fleet(build_engine(settings).launch_specs(settings.server, out),
                         registry_for(out), "c", 5.0)
    old_pid = first[0].record.pid
    second = launch_fleet(build_engine(settings).launch_specs(settings.server, out),
                          registry_for(out), "c", 5.0)
    try:
        assert not is_alive(old_pid)
        assert second[0].record.pid != old_pid
        assert [r.pid for r in registry_for(out).load()] == [second[0].record.pid]
    finally:
        stop_fleet(second, registry_for(out), 5.0)


def test_a_process_we_did_not_start_is_never_signalled(tmp_path: Path) -> None:
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        registry = ProcessRegistry(tmp_path / "registry.json")
        registry.save([ProcessRecord(stranger.pid, start_ticks=1, port=1, host="127.0.0.1",
                                     log_path="x", argv=["x"])])
        stop_fleet([], registry, 1.0)
        time.sleep(0.2)
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()


def test_port_held_by_another_program_is_a_clear_error(tmp_path: Path) -> None:
    settings = sim_settings(tmp_path, 1)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", settings.base_port))
        sock.listen()
        with pytest.raises(LaunchError, match="in use by another program"):
            out = Path(settings.output)
            launch_fleet(build_engine(settings).launch_specs(settings.server, out),
                         registry_for(out), "c", 5.0)


def test_servers_get_their_gpu_and_a_log_each(tmp_path: Path) -> None:
    settings = sim_settings(tmp_path, 2, gpus=[3, 5])
    specs = build_engine(settings).launch_specs(settings.server, Path(settings.output))
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in specs] == ["3", "5"]
    assert len({s.port for s in specs}) == 2
    assert [s.log_path.name for s in specs] == ["server-0-gpu3.log", "server-1-gpu5.log"]


def test_the_api_key_is_never_on_a_command_line(sim_fleet, tmp_path: Path) -> None:
    """argv is world-readable (/proc/PID/cmdline) and kept in the registry: the key travels
    in a private --config file instead, deleted once the server is healthy."""
    import httpx

    from infra.sglang.secret_config import secret_file_of
    from tasks.health import wait_until_healthy

    key = "sk-argv-test-81d2"
    handles = sim_fleet(1, wait=False, api_key=key)
    record = handles[0].record
    cmdline = Path(f"/proc/{record.pid}/cmdline").read_bytes()
    assert key.encode() not in cmdline and b"--config" in cmdline
    registry = (tmp_path / "out" / "servers" / "registry.json").read_text()
    assert key not in registry
    secret_file = secret_file_of(record.argv)
    assert secret_file is not None and secret_file.parent.stat().st_mode & 0o777 == 0o700
    if secret_file.exists():  # the server may not have been polled healthy yet
        assert secret_file.stat().st_mode & 0o777 == 0o600
    wait_until_healthy(handles, key, 60.0)
    assert not secret_file.exists()
    url = f"{handles[0].url}/generate"
    body = {"text": "hi", "sampling_params": {"max_new_tokens": 2}}
    assert httpx.post(url, json=body, timeout=30).status_code == 401
    ok = httpx.post(url, json=body, headers={"Authorization": f"Bearer {key}"}, timeout=30)
    assert ok.status_code == 200


def test_several_servers_share_one_gpu(tmp_path: Path) -> None:
    """servers_per_gpu: consecutive ports and logs per server, the same CUDA device."""
    from infra.settings import load_settings
    from tasks.engines import build_engine

    settings = load_settings(None, gpus=[0, 1], servers_per_gpu=3, base_port=31000)
    specs = build_engine(settings).launch_specs(settings.server, tmp_path)
    assert [s.port for s in specs] == list(range(31000, 31006))
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in specs] == ["0"] * 3 + ["1"] * 3
    assert len({s.log_path for s in specs}) == 6
