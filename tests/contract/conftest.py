"""The simulator the contract tests hold to real SGLang: one per module, the 27B text shapes
on an H200 profile under SGLang 0.5.17, with its tokenizer, through the real launch path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

MODEL_27B = Path(__file__).resolve().parents[1] / "fixtures" / "models" / "qwen3.6-27b-text"


@pytest.fixture(scope="module")
def sim_url(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from tasks.engines import build_engine
    from tasks.health import wait_until_healthy
    from tasks.local_servers import launch_fleet, registry_for, stop_fleet
    from tests.conftest import sim_settings

    tmp = tmp_path_factory.mktemp("shapes")
    settings = sim_settings(tmp, 1, model=str(MODEL_27B), weights_gib=50.16,
                            gpu_type="h200", sglang_version="0.5.17",
                            **{"sim.gpu": "h200", "server.mamba_strategy": "extra_buffer"})
    out = Path(settings.output)
    handles = launch_fleet(build_engine(settings).launch_specs(settings.server, out),
                           registry_for(out),
                           settings.server.fingerprint(), 5.0)
    try:
        wait_until_healthy(handles, None, 60.0)
        yield handles[0].url
    finally:
        stop_fleet(handles, registry_for(out), 5.0)
