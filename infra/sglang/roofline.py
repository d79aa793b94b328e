"""Decode/prefill time model: memory-bandwidth roofline plus calibrated per-request terms.

Used by the simulator to pace its steps and by the planner to predict throughput, so the
"analytic maximum" a benchmark compares against is the simulator's own. Calibration against
the seeds is documented in docs/SIMULATOR.md; it is a fit to two runs, not a law.
"""

from __future__ import annotations

from dataclasses import dataclass

from infra.sglang.flags import ServerFlags
from infra.sglang.memory import MemoryPlan, per_slot_bytes
from infra.sglang.profiles import GpuProfile, ModelProfile

# Calibration (docs/SIMULATOR.md): fraction of peak bandwidth reached by decode kernels.
BANDWIDTH_EFFICIENCY = 0.7
# Per running request per step: scheduler/sampling overhead not hidden by the GPU (seconds).
PER_REQUEST_OVERHEAD_S = 5.0e-5
# Fixed per-step cost (launch, sampling) with overlap on; overlap off adds the CPU part.
STEP_OVERHEAD_S = 1.5e-3
NO_OVERLAP_EXTRA_S = 1.0e-3
# extra_buffer ping-pong tracking traffic per running request per step, in mamba slots.
# Fit so seed 000 (extra_buffer, 31 running ≈ 490 tok/s/GPU) and its no_buffer rerun
# (≈ 1,175 tok/s/GPU) both hold; see docs/SIMULATOR.md for why this is a fit.
EXTRA_BUFFER_TRACKING_SLOTS = 6.6
# Speculative verify + draft cost relative to a plain decode step, per draft token.
SPEC_COST_PER_DRAFT_TOKEN = 0.12
# Prefill: fraction of peak bf16 FLOPs reached.
PREFILL_EFFICIENCY = 0.5


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

    def decode_step_s(self, running: int, avg_context_tokens: float) -> float:
        """Seconds of GPU time for one decode step of `running` requests."""
        traffic = self.weights_bytes + running * (
            self.state_bytes_per_request + avg_context_tokens * self.kv_bytes_per_token)
        step = traffic / self.bandwidth_bps + running * PER_REQUEST_OVERHEAD_S + STEP_OVERHEAD_S
        if not self.overlap:
            step += NO_OVERLAP_EXTRA_S
        return step * self.spec_factor

    def prefill_s(self, tokens: int) -> float:
        return tokens * self.flops_per_token / self.peak_flops

    def tokens_per_s(self, running: int, avg_context_tokens: float) -> float:
        """Steady-state generated tokens/s with `running` requests (no prefill)."""
        if running <= 0:
            return 0.0
        return running * self.accept_len / self.decode_step_s(running, avg_context_tokens)


def build_roofline(model: ModelProfile, gpu: GpuProfile, flags: ServerFlags,
                   plan: MemoryPlan, accept_len: float | None = None) -> Roofline:
    conv, ssm = per_slot_bytes(model, flags)
    state = 2.0 * (conv + ssm)
    if plan.mamba_strategy == "extra_buffer" or plan.mamba_strategy == "extra_buffer_lazy":
        state += EXTRA_BUFFER_TRACKING_SLOTS * (conv + ssm)
    draft = plan.draft_tokens
    accept = (accept_len or model.mtp_accept_len) if draft else 1.0
    accept = min(accept, float(draft)) if draft else 1.0
    tp = flags.tp_size
    return Roofline(
        weights_bytes=model.weights_gib * (1 << 30) / tp,
        state_bytes_per_request=state,
        kv_bytes_per_token=float(plan.kv_cell_bytes),
        bandwidth_bps=gpu.bandwidth_gbs * 1e9 * BANDWIDTH_EFFICIENCY,
        flops_per_token=2.0 * model.active_params_b * 1e9 / tp,
        peak_flops=gpu.bf16_tflops * 1e12 * PREFILL_EFFICIENCY,
        overlap=plan.overlap_schedule,
        accept_len=accept,
        spec_factor=1.0 + SPEC_COST_PER_DRAFT_TOKEN * draft,
    )
