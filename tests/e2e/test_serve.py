"""`python flows/serve.py` never takes a deployment off the work pool `prefect deploy` put it
on: it refuses in one line naming `--name`, and the deployment keeps its pool."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_serving_a_work_pool_deployment_is_refused(prefect_api: None,
                                                   prefect_env: dict[str, str]) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.deployments.runner import RunnerDeployment
    from prefect.exceptions import ObjectAlreadyExists

    from flows.generate import generate
    from flows.serve import work_pool_of

    with get_client(sync_client=True) as client, contextlib.suppress(ObjectAlreadyExists):
        client.create_work_pool(WorkPoolCreate(name="serve-check-pool", type="process"))
    runner = generate.to_deployment(name="serve-check")  # sync here: not a coroutine
    assert isinstance(runner, RunnerDeployment)
    runner.apply(work_pool_name="serve-check-pool")
    proc = subprocess.run([sys.executable, "flows/serve.py", "--name", "serve-check"], cwd=ROOT,
                          env={**os.environ, **prefect_env}, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --name: deployment "
                                                   "generate/serve-check runs on work pool "
                                                   "'serve-check-pool'"), proc.stderr
    assert work_pool_of("generate/serve-check") == "serve-check-pool"  # left as it was
    assert work_pool_of("generate/no-such-deployment") is None
