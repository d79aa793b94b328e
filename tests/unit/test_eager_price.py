"""A batch past the decode CUDA graphs runs eager on every GPU and family: the step model
prices it so, also where only another family (or another GPU) measured the eager step — a cap
past the graphs must never look as fast as the same cap with them."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.sglang.flags import ServerFlags
from infra.sglang.planner import evaluate
from infra.sglang.profiles import gpu_profile, model_profile
from infra.sglang.roofline import calibration_for, calibration_key, measured_calibrations
from infra.sglang.versions import parse_version
from infra.sim.predict import Workload

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "bench" / "real_sglang" / "models" / "granite-4.0-h-tiny" / "config.json"


@pytest.mark.parametrize("gpu", ["h200", "h100", "b200"])
def test_an_unmeasured_familys_eager_step_costs_what_its_gpus_did(gpu: str) -> None:
    model = model_profile(str(TINY), 12.93)
    cal = calibration_for(gpu_profile(gpu), model)
    assert cal.eager_layer_s > 0, calibration_key(gpu_profile(gpu), model)


def test_a_familys_own_entry_keeps_what_it_measured() -> None:
    table = measured_calibrations()
    assert table["H200/mamba2"].eager_layer_s == table["H200"].eager_layer_s
    assert table["H200/mamba2"].step_overhead_s != table["H200"].step_overhead_s


def test_the_same_cap_without_graphs_is_planned_slower() -> None:
    model, gpu = model_profile(str(TINY), 12.93), gpu_profile("h200")
    work = Workload(1024, 256)
    flags = ServerFlags(mamba_strategy="no_buffer", max_running_requests=320)
    eager = evaluate("eager", model, gpu, flags, parse_version("0.5.17"), 2048.0, work)
    graphed = evaluate("graphed", model, gpu,
                       ServerFlags(mamba_strategy="no_buffer", max_running_requests=320,
                                   extra_args=["--cuda-graph-max-bs", "320"]),
                       parse_version("0.5.17"), 2048.0, work)
    assert eager.plan is not None and not eager.plan.graphs_cover_cap
    assert graphed.plan is not None and graphed.plan.graphs_cover_cap
    slow, fast = eager.committed_tok_s_per_gpu, graphed.committed_tok_s_per_gpu
    assert slow is not None and fast is not None and slow < 0.8 * fast
