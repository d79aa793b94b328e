"""An API key set for a run appears in no log, artifact, report, manifest or shard of it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import free_port_block

SECRET = "sk-expansion-test-5f3c9a"


@pytest.mark.slow
def test_the_api_key_leaks_nowhere(prefect_api: None, tmp_path: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from prefect.client.orchestration import get_client

    from flows.generate import generate

    monkeypatch.setenv("EXPANSION_API_KEY", SECRET)  # the way to pass secrets: env, not params
    src = tmp_path / "p.jsonl"
    src.write_text("".join(json.dumps({"id": i, "prompt": f"q {i}"}) + "\n" for i in range(60)))
    out = tmp_path / "out"
    summary = generate(prompts=str(src), output=str(out), gpus=[0], overrides={
        "base_port": free_port_block(1), "sim.startup_s": 0.2, "sim.time_scale": 500.0,
        "sampling.max_new_tokens": 16, "shard_size": 20, "upload_to": str(tmp_path / "copy")})
    assert summary["prompts_done_this_run"] == 60  # the servers really required the key
    logs = list((out / "servers").glob("*.log"))
    assert logs and any("api_key='***'" in p.read_text() for p in logs)
    for path in [*out.rglob("*"), *(tmp_path / "copy").rglob("*")]:
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), f"secret found in {path}"
    assert SECRET not in json.dumps(summary)
    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts()
        runs = client.read_flow_runs()
    blob = json.dumps([a.model_dump(mode="json") for a in artifacts]
                      + [r.model_dump(mode="json") for r in runs])
    assert SECRET not in blob


@pytest.mark.slow
def test_a_key_set_on_the_command_line_is_not_stored_as_a_parameter(
        prefect_api: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`expansion run --set api_key=…`: the key reaches the flow through the CLI process's
    environment; Prefect's database (parameters, shown in the UI) never holds it."""
    from prefect.client.orchestration import get_client
    from typer.testing import CliRunner

    from expansion.cli import app

    monkeypatch.setenv("EXPANSION_API_KEY", "restored-after-the-test")  # undone at teardown
    src = tmp_path / "p.jsonl"
    src.write_text("".join(json.dumps({"id": i, "prompt": f"q {i}"}) + "\n" for i in range(30)))
    out = tmp_path / "out"
    result = CliRunner().invoke(app, [
        "run", "--prompts", str(src), "--output", str(out), "--gpus", "0",
        "--set", f"api_key={SECRET}", "--set", f"base_port={free_port_block(1)}",
        "--set", "sim.startup_s=0.2", "--set", "sim.time_scale=500", "--set",
        "sampling.max_new_tokens=16", "--set", "shard_size=10", "--set", "tuning.enabled=false"])
    assert result.exit_code == 0, result.output[-3000:]
    logs = list((out / "servers").glob("*.log"))
    assert logs and any("api_key='***'" in p.read_text() for p in logs)  # servers required it
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs()
    mine = [r for r in runs if r.parameters.get("output") == str(out)]
    assert len(mine) == 1 and "api_key" not in mine[0].parameters.get("overrides", {})
    assert SECRET not in json.dumps([r.model_dump(mode="json") for r in runs])
