"""A node run that never makes progress is cancelled by generate-fleet's watchdog instead of
blocking the round forever (here: a deployment no worker serves, so its runs never start)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flows.fleet import NodeWatch


def test_a_node_is_stalled_only_after_the_timeout_without_new_shards() -> None:
    w = NodeWatch("node-0", "run", since=100.0)
    assert not w.stalled(0, 150.0, 60.0)
    assert w.stalled(0, 161.0, 60.0)
    assert not w.stalled(1, 170.0, 60.0)  # a shard was published: the clock restarts
    assert not w.stalled(1, 229.0, 60.0) and w.stalled(1, 231.0, 60.0)
    assert not w.stalled(1, 10_000.0, 0.0)  # 0 turns the watchdog off


@pytest.mark.slow
def test_fleet_cancels_a_node_run_that_never_progresses(prefect_api: None,
                                                        tmp_path: Path) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterName

    from flows.fleet import generate_fleet
    from flows.generate import generate

    runner = generate.to_deployment(name="nobody-serves")  # sync here: not a coroutine
    assert not hasattr(runner, "__await__")
    deployment_id = runner.apply()
    src = tmp_path / "p.jsonl"
    src.write_text("".join(json.dumps({"id": i, "prompt": f"q {i}"}) + "\n" for i in range(40)))
    with pytest.raises(RuntimeError, match="still pending after 1 rounds"):
        generate_fleet(output=str(tmp_path / "out"), prompts=str(src), nodes=2,
                       deployment="generate/nobody-serves", max_rounds=1, poll_s=0.2,
                       node_stall_timeout_s=2.0, overrides={"shard_size": 10})
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(deployment_filter=DeploymentFilter(
            name=DeploymentFilterName(any_=["nobody-serves"])))
    assert len(runs) == 2 and all(r.deployment_id == deployment_id for r in runs)
    assert {r.state.type.value for r in runs if r.state} == {"CANCELLED"}
    assert all("node_stall_timeout_s" in (r.state.message or "") for r in runs if r.state)
