"""Decode/prefill time model: memory-bandwidth roofline plus calibrated per-request terms.

Used by the simulator to pace its steps and by the planner to predict throughput, so the
"analytic maximum" a benchmark compares against is the simulator's own. The constants come
per GPU (and, where measured, per architecture family: `H200/mamba2`) from
`data/step_calibration.json`, written by `bench/real_sglang/fit.py` from real
SGLang runs (the H200); a GPU without a measurement keeps the fit to the seeds' two runs
(RTX PRO 6000), which is a fit, not a law. docs/SIMULATOR.md gives both and their residuals.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, fields
from pathlib import Path

from infra.sglang.flags import ServerFlags
from infra.sglang.memory import MemoryPlan, per_slot_bytes
from infra.sglang.profiles import GpuProfile, ModelProfile

CALIBRATION_FILE = Path(__file__).parent / "data" / "step_calibration.json"


@dataclass(frozen=True)
class StepCalibration:
    """The decode step's constants on one GPU."""

    bandwidth_efficiency: float  # fraction of peak bandwidth decode kernels reach
    per_request_overhead_s: float  # per running request per step, beyond its traffic
    step_overhead_s: float  # fixed per step (launch, sampling) with overlap on
    no_overlap_extra_s: float  # what turning the overlap scheduler off adds per step
    extra_buffer_tracking_slots: float  # ping-pong tracking traffic per request, in slots
    # Prefill: fraction of peak bf16 FLOPs reached. 0.5 is a guess the seeds never tested;
    # the H200's comes from SGLang's own prefill lines (bench/real_sglang/fit.py).
    prefill_efficiency: float = 0.5


# The seeds' fit (RTX PRO 6000, a pre-rename build): seed 000 extra_buffer with 31 running
# ≈ 490 tok/s/GPU and its no_buffer rerun ≈ 1,175 tok/s/GPU both hold. The H200 does not
# confirm its tracking term (docs/SIMULATOR.md).
DEFAULT_CALIBRATION = StepCalibration(
    bandwidth_efficiency=0.7, per_request_overhead_s=5.0e-5, step_overhead_s=1.5e-3,
    no_overlap_extra_s=1.0e-3, extra_buffer_tracking_slots=6.6)


@functools.cache
def measured_calibrations() -> dict[str, StepCalibration]:
    """GPU name (as in its profile) → constants fitted from real runs on it."""
    raw = json.loads(CALIBRATION_FILE.read_text())
    names = {f.name for f in fields(StepCalibration)}
    return {gpu: StepCalibration(**{k: v for k, v in values.items() if k in names})
            for gpu, values in raw.items()}


def calibration_for(gpu: GpuProfile, model: ModelProfile | None = None) -> StepCalibration:
    """The constants measured for this family on this GPU (`H200/mamba2`), else the GPU's
    own (fitted on the Qwen3.6-27B shapes, a GDN hybrid), else the seeds' fit."""
    table = measured_calibrations()
    if model is not None and f"{gpu.name}/{model.family}" in table:
        return table[f"{gpu.name}/{model.family}"]
    return table.get(gpu.name, DEFAULT_CALIBRATION)

# Speculative verify + draft cost relative to a plain decode step, per draft token.
SPEC_COST_PER_DRAFT_TOKEN = 0.12


@dataclass(frozen=True)
class Roofline:
    """Step-time model for one server configuration."""

    weights_bytes: float
    state_bytes_per_request: float  # read + write of one request's mamba state per step
    kv_bytes_per_token: float
    bandwidth_bps: float
    flops_per_token: float
    peak_flops: float
    overlap: bool
    accept_len: float
    spec_factor: float
    calibration: StepCalibration = DEFAULT_CALIBRATION

    def decode_step_s(self, running: int, avg_context_tokens: float) -> float:
        """Seconds of GPU time for one decode step of `running` requests."""
        traffic = self.weights_bytes + running * (
            self.state_bytes_per_request + avg_context_tokens * self.kv_bytes_per_token)
        cal = self.calibration
        step = (traffic / self.bandwidth_bps + running * cal.per_request_overhead_s
                + cal.step_overhead_s)
        if not self.overlap:
            step += cal.no_overlap_extra_s
        return step * self.spec_factor

    def prefill_s(self, tokens: int) -> float:
        return tokens * self.flops_per_token / self.peak_flops

    def tokens_per_s(self, running: int, avg_context_tokens: float) -> float:
        """Steady-state generated tokens/s with `running` requests (no prefill)."""
        if running <= 0:
            return 0.0
        return running * self.accept_len / self.decode_step_s(running, avg_context_tokens)


def build_roofline(model: ModelProfile, gpu: GpuProfile, flags: ServerFlags,
                   plan: MemoryPlan, accept_len: float | None = None,
                   calibration: StepCalibration | None = None) -> Roofline:
    cal = calibration or calibration_for(gpu, model)
    conv, ssm = per_slot_bytes(model, flags)
    state = 2.0 * (conv + ssm)
    if plan.mamba_strategy == "extra_buffer" or plan.mamba_strategy == "extra_buffer_lazy":
        state += cal.extra_buffer_tracking_slots * (conv + ssm)
    draft = plan.draft_tokens
    accept = (accept_len or model.mtp_accept_len) if draft else 1.0
    accept = min(accept, float(draft)) if draft else 1.0
    tp = flags.tp_size
    return Roofline(
        weights_bytes=model.weights_gib * (1 << 30) / tp,
        state_bytes_per_request=state,
        kv_bytes_per_token=float(plan.kv_cell_bytes),
        bandwidth_bps=gpu.bandwidth_gbs * 1e9 * cal.bandwidth_efficiency,
        flops_per_token=2.0 * model.active_params_b * 1e9 / tp,
        peak_flops=gpu.bf16_tflops * 1e12 * cal.prefill_efficiency,
        overlap=plan.overlap_schedule,
        accept_len=accept,
        spec_factor=1.0 + SPEC_COST_PER_DRAFT_TOKEN * draft,
        calibration=cal,
    )
