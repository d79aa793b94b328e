"""`prefect deployment run generate/expansion` on a real Prefect server with a process worker
(a CLI run on its output meanwhile refuses, naming the deployment's flow run, which finishes
unharmed), and cancellation from the CLI leaving no server process and no busy port."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from infra.manifest import Manifest
from infra.processes import ProcessRegistry, is_alive, port_is_free
from tests import session as run_session
from tests.conftest import free_port_block, stop_process_group

ROOT = Path(__file__).resolve().parents[2]
PREFECT = str(Path(sys.executable).parent / "prefect")
POOL = "gpu-local"
ROWS = 600
TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


def prefect(env: dict[str, str], *args: str, timeout: float = 300) -> str:
    proc = subprocess.run([PREFECT, *args], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"prefect {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def worker(prefect_server: dict[str, str], s3_endpoint: str,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    # Workers of one pool must be interchangeable, as on a real cluster: this one shares
    # "gpu-local" on the run's Prefect server with test_fleet.py's. The work-pool lock keeps
    # the two modules' workers from polling at once; the S3 settings are the same anyway.
    env = {**os.environ, **prefect_server,
           "PREFECT_WORKER_QUERY_SECONDS": "1", "PREFECT_WORKER_PREFETCH_SECONDS": "1",
           "EXPANSION_SIM__STARTUP_S": "0.2", "EXPANSION_STOP_GRACE_S": "5",
           "EXPANSION_STORAGE__ENDPOINT_URL": s3_endpoint,
           "EXPANSION_SAMPLING__MAX_NEW_TOKENS": "32"}
    with run_session.work_pools_held():  # the pools are this module's until it ends
        for pool in (POOL, "control"):
            subprocess.run([PREFECT, "work-pool", "create", pool, "--type", "process"], env=env,
                           cwd=ROOT, capture_output=True, timeout=120)
        prefect(env, "--no-prompt", "deploy", "--all", "--prefect-file", "deployments/prefect.yaml")
        log_path = tmp_path_factory.mktemp("worker") / "worker.log"
        env["DEPLOYMENT_TEST_WORKER_LOG"] = str(log_path)
        log = open(log_path, "wb")  # noqa: SIM115
        proc = subprocess.Popen([PREFECT, "worker", "start", "--pool", POOL, "--limit", "1"],
                                env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            yield env
        finally:
            stop_process_group(proc, signal.SIGINT)  # workers stop cleanly on SIGINT, not SIGTERM
            log.close()


def write_prompts(path: Path, n: int) -> Path:
    path.write_text("".join(json.dumps({"id": f"d{i}", "prompt": f"deploy {i}"}) + "\n"
                            for i in range(n)))
    return path


def run_params(out: Path, src: Path, port: int, time_scale: float) -> list[str]:
    overrides = {"base_port": port, "sim.time_scale": time_scale, "shard_size": 50}
    return ["--param", f"output={out}", "--param", f"prompts={src}",
            "--param", "gpus=[0, 1]", "--param", f"overrides={json.dumps(overrides)}"]


@pytest.mark.slow
@pytest.mark.xdist_group("prefect_server")
def test_deployment_run_completes_through_a_worker_and_a_cli_run_beside_it_refuses(
        worker: dict[str, str], tmp_path: Path) -> None:
    src = write_prompts(tmp_path / "p.jsonl", ROWS)
    out = tmp_path / "out"
    text = prefect(worker, "deployment", "run", "generate/expansion",
                   *run_params(out, src, free_port_block(2), 1.0))
    run_id = re.search(r"UUID:\s*([0-9a-f-]{36})", text)
    assert run_id, text
    name = flow_run(worker, run_id[1])["name"]
    wait_until(lambda: len(committed(out)) >= 1, "no shard committed")
    cli = subprocess.run([sys.executable, "-m", "expansion.cli", "run", "--prompts", str(src),
                          "--output", str(out), "--gpus", "0,1"], env=worker, cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert len(committed(out)) < ROWS // 50, "the deployment run ended before the CLI run read"
    said = cli.stderr.strip().splitlines()
    assert cli.returncode == 2 and len(said) == 1, cli.stderr[-3000:]
    assert said[0].startswith(f"error: output: {out} is in use by a live run (flow run "
                              f"'{name}', pid "), said
    wait_until(lambda: flow_run(worker, run_id[1])["state"]["type"] in TERMINAL,
               lambda: f"the deployment run never ended ({len(committed(out))} of {ROWS // 50} "
               f"shards committed); the worker's log ends:\n{worker_log_tail(worker)}", 400)
    assert flow_run(worker, run_id[1])["state"]["type"] == "COMPLETED"  # unharmed
    frame = Manifest(out).read_completions()
    assert frame.height == ROWS and frame["id"].n_unique() == ROWS


def worker_log_tail(env: dict[str, str], lines: int = 60) -> str:
    """The worker streams its flow runs' logs: what the run was doing when a wait ran out."""
    text = Path(env["DEPLOYMENT_TEST_WORKER_LOG"]).read_text(errors="replace")
    return "\n".join(text.splitlines()[-lines:])


def flow_run(env: dict[str, str], run_id: str) -> dict[str, Any]:
    answer: dict[str, Any] = httpx.get(f"{env['PREFECT_API_URL']}/flow_runs/{run_id}").json()
    return answer


def committed(out: Path) -> list[int]:
    try:
        return sorted(Manifest(out).committed())
    except (OSError, ValueError):
        return []


def wait_until(done: Callable[[], bool], why: str | Callable[[], str],
               timeout_s: float = 180) -> None:
    """`why` may be a function: a message about the moment the wait ran out, not its start."""
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, why() if callable(why) else why
        time.sleep(0.3)


@pytest.mark.slow
@pytest.mark.xdist_group("prefect_server")
def test_cancel_from_the_cli_leaves_no_server_behind(worker: dict[str, str],
                                                     tmp_path: Path) -> None:
    src = write_prompts(tmp_path / "p.jsonl", 3000)
    out = tmp_path / "out"
    port = free_port_block(2)
    text = prefect(worker, "deployment", "run", "generate/expansion",
                   *run_params(out, src, port, 1.0))
    run_id = re.search(r"UUID:\s*([0-9a-f-]{36})", text)
    assert run_id, text
    registry = ProcessRegistry(out / "servers" / "registry.json")
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and not (
            len(registry.load()) == 2 and (out / "manifest.jsonl").exists()):
        time.sleep(0.5)
    records = registry.load()
    assert len(records) == 2, "the servers never came up"
    prefect(worker, "flow-run", "cancel", run_id[1])
    api = worker["PREFECT_API_URL"]
    state = None
    while time.monotonic() < deadline:
        state = httpx.get(f"{api}/flow_runs/{run_id[1]}").json()["state"]["type"]
        if state == "CANCELLED":
            break
        time.sleep(0.5)
    assert state == "CANCELLED"
    gone_by = time.monotonic() + 30
    while time.monotonic() < gone_by and any(is_alive(r.pid) for r in records):
        time.sleep(0.2)
    assert not any(is_alive(r.pid) for r in records)
    assert port_is_free("127.0.0.1", port) and port_is_free("127.0.0.1", port + 1)
