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
