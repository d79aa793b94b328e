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
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from infra.sglang.flags import ServerFlags
from infra.sglang.memory import MemoryPlan, per_slot_bytes
from infra.sglang.profiles import GPUS, GpuProfile, ModelProfile
from infra.sglang.shapes import MoeShape

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
    # MoE decode: the routed experts' grouped GEMMs reach this share of peak bf16 FLOPs (small
    # per-expert batches); fitted on the Qwen3.6-35B-A3B shapes (bench/real_sglang/fit_moe.py)
    moe_efficiency: float = 0.05
    # A batch above the decode CUDA-graph size runs eager: this much more per layer and step
    # (the same fit: 72.7 ms eager against 37.8 ms graphed at 313 running, 40 layers)
    eager_layer_s: float = 0.0
    # Per running request and linear-attention layer, on top of per_request_overhead_s (the MoE
    # fit: 35B-A3B's 30 GDN and Kimi-Linear's 20 KDA layers cost in proportion)
    per_linear_layer_request_s: float = 0.0
    # Under --load-format dummy a random router sends a batch's tokens to few experts: the
    # share of them it spreads over, per architecture, as measured (1.0 where unmeasured)
    dummy_routed_spread: tuple[tuple[str, float], ...] = ()
    # MLA decode attention (Kimi-Linear's full layers): its absorbed QK and PV products over
    # the 576-wide latent of every context token reach this share of peak bf16 FLOPs; their
    # bytes alone (the latent is small) miss most of what long contexts cost. 0: unmeasured
    mla_attention_efficiency: float = 0.0
    # A prefill forward's cost beyond its tokens' FLOPs (its kernels' launches: the chunked
    # scan of every Mamba2 layer runs eager): seconds per prefill batch. 0: unmeasured
    prefill_batch_s: float = 0.0
    # Decode attention's KV reads cost this many times their bytes at the GPU's bandwidth
    # share (short per-request contexts of few KV heads do not stream at full speed). 1: the
    # bytes alone, as every fit before the H100's assumed
    kv_read_factor: float = 1.0
    # How many times a step moves one request's mamba state at the bandwidth share: 2, a read
    # and a write, as every fit before the H100's Mamba2 + MoE one assumed; that fit, on two
    # model sizes with fp32 and bf16 state, measures about one pass
    state_passes: float = 2.0


# The seeds' fit (RTX PRO 6000, a pre-rename build): seed 000 extra_buffer with 31 running
# ≈ 490 tok/s/GPU and its no_buffer rerun ≈ 1,175 tok/s/GPU both hold. The H200 does not
# confirm its tracking term (docs/SIMULATOR.md). Its eager step is the H200's (the only GPU
# that measured one): an eager batch is never free, and 0 would make a cap past the graphs look so.
DEFAULT_CALIBRATION = StepCalibration(
    bandwidth_efficiency=0.7, per_request_overhead_s=5.0e-5, step_overhead_s=1.5e-3,
    no_overlap_extra_s=1.0e-3, extra_buffer_tracking_slots=6.6, eager_layer_s=8.61e-4)


# Constants of the GPU and runtime rather than of a model family: a family's entry that did not
# measure them takes its GPU's. The eager step's extra cost is the launches a CUDA graph saves,
# per layer; priced at 0 where unmeasured, a cap above the graphs would look free.
GPU_WIDE = ("eager_layer_s",)


@functools.cache
def _calibration_table() -> dict[str, dict[str, Any]]:
    """data/step_calibration.json as written by the fits, read once."""
    table: dict[str, dict[str, Any]] = json.loads(CALIBRATION_FILE.read_text())
    return table


@functools.cache
def measured_calibrations() -> dict[str, StepCalibration]:
    """GPU name (as in its profile) → constants fitted from real runs on it."""
    raw = _calibration_table()
    names = {f.name for f in fields(StepCalibration)}
    out = {}
    for gpu, values in raw.items():
        base = raw.get(gpu.split("/")[0], {})
        inherited = {k: base[k] for k in GPU_WIDE if k in base and k not in values}
        kept = {k: v for k, v in {**values, **inherited}.items() if k in names}
        kept["dummy_routed_spread"] = tuple(sorted(kept.get("dummy_routed_spread", {}).items()))
        out[gpu] = StepCalibration(**kept)
    return out


# The MoE fit saw 256-expert models; a small test MoE (the tiny Qwen3-Next's 8 experts, whose
# step is the scheduler's, not its weights') keeps the GPU's own constants.
MOE_CALIBRATED_EXPERTS = 64


def calibration_for(gpu: GpuProfile, model: ModelProfile | None = None) -> StepCalibration:
    """The constants measured for this family on this GPU (`H200/mamba2`; `H200/gdn-moe` for
    an MoE of the fitted regime), else the GPU's own (fitted on the Qwen3.6-27B shapes, a GDN
    hybrid), else the seeds' fit."""
    key = calibration_key(gpu, model)
    return measured_calibrations()[key] if key is not None else DEFAULT_CALIBRATION


def calibration_key(gpu: GpuProfile, model: ModelProfile | None = None) -> str | None:
    """The entry of data/step_calibration.json the constants come from (None: none).

    The entry fitted on the model's kind (its MoE regime for an MoE, its family for the rest)
    on this GPU, else on a GPU of its generation; then the family's dense fit for an MoE the
    same way; then this GPU's own entry, else its generation's. A generation's GPUs share one
    entry's constants because they are shares of the GPU's own bandwidth and FLOPs and costs
    of the same kernels: the 27B's H200 fit, never shown an H100, plans the H100's waves
    within 1.4 % where the seeds' RTX PRO 6000 fit was 18 % low (tests/unit/test_real_h100.py)."""
    table = measured_calibrations()
    if model is not None:
        for exact in (True, False):
            for name in _same_generation(gpu):
                key = _kind_entry(name, model, table, exact)
                if key is not None:
                    return key
    return next((name for name in _same_generation(gpu) if name in table), None)


def _same_generation(gpu: GpuProfile) -> list[str]:
    """This GPU's name, then the other profiles' of its generation (in profile order)."""
    siblings = [g.name for g in GPUS.values()
                if gpu.generation and g.generation == gpu.generation and g.name != gpu.name]
    return [gpu.name, *siblings]


def _kind_entry(gpu_name: str, model: ModelProfile, table: dict[str, StepCalibration],
                exact: bool) -> str | None:
    """That GPU's entry for the model: `exact`, the one fitted on its kind (an MoE's regime,
    else its family's: a GDN model's is the GPU's own, fitted on the 27B); else, for an MoE,
    its family's dense fit."""
    moe = model.moe is not None and model.moe.num_experts >= MOE_CALIBRATED_EXPERTS
    dense = f"{gpu_name}/{model.family}" if model.family != "gdn" else gpu_name
    wanted = f"{gpu_name}/{model.family}-moe" if moe and exact else dense
    if not exact and not moe:
        return None  # a dense model's only entry is its exact one
    return wanted if wanted in table else None


# Speculative verify + draft cost relative to a plain decode step, per draft token.
SPEC_COST_PER_DRAFT_TOKEN = 0.12


@dataclass(frozen=True)
class Roofline:
    """Step-time model for one server configuration."""

    weights_bytes: float  # everything a step reads whatever the batch (routed experts aside)
    state_bytes_per_request: float  # one request's mamba state moved per step (state_passes)
    kv_bytes_per_token: float
    bandwidth_bps: float
    flops_per_token: float
    peak_flops: float
    overlap: bool
    accept_len: float
    spec_factor: float
    calibration: StepCalibration = DEFAULT_CALIBRATION
    moe: MoeShape | None = None
    expert_bytes: float = 0.0  # one routed expert of one layer, on one GPU
    graph_max_bs: int = 0  # larger batches run eager (0: graphs cover every batch)
    num_layers: int = 0
    routed_spread: float = 1.0  # share of the routed experts a batch's tokens spread over
    linear_layers: int = 0
    bf16_flops: float = 0.0  # the GPU's peak, before any efficiency
    attention_flops_per_token: float = 0.0  # MLA: per context token of a request, one step
    # (seconds, seconds per context token) of a step, by batch size: a replay asks for the
    # same few hundred batch sizes ~10⁴ times
    _terms: dict[int, tuple[float, float]] = field(default_factory=dict, repr=False,
                                                   compare=False)

    def decode_step_s(self, running: int, avg_context_tokens: float) -> float:
        """Seconds of GPU time for one decode step of `running` requests: a part the batch
        size sets, and one linear in the mean context."""
        fixed, per_context = self._step_terms(running)
        return fixed + per_context * avg_context_tokens

    def _step_terms(self, running: int) -> tuple[float, float]:
        terms = self._terms.get(running)
        if terms is None:
            terms = self._terms[running] = (self._fixed_step_s(running) * self.spec_factor,
                                            self._context_step_s(running) * self.spec_factor)
        return terms

    def _fixed_step_s(self, running: int) -> float:
        """Weights, states, per-request work, experts, overheads: all but the context."""
        cal = self.calibration
        per_request = (cal.per_request_overhead_s
                       + self.linear_layers * cal.per_linear_layer_request_s)
        step = ((self.weights_bytes + running * self.state_bytes_per_request)
                / self.bandwidth_bps + running * per_request + cal.step_overhead_s
                + self._moe_s(running))
        if not self.overlap:
            step += cal.no_overlap_extra_s
        if not self.graphed(running):
            step += self.num_layers * cal.eager_layer_s
        return step

    def _context_step_s(self, running: int) -> float:
        """Seconds per token of mean context: its KV read, and MLA's attention compute."""
        return (running * self.kv_bytes_per_token * self.calibration.kv_read_factor
                / self.bandwidth_bps + self._attention_s(float(running)))

    def decode_steps_s(self, running: int, avg_context_tokens: float, steps: int,
                       growth: float) -> float:
        """Seconds of `steps` decode steps of a constant batch whose mean context grows by
        `growth` tokens a step: the step time is linear in the context, so the sum is exact
        as the mean of the first and last step (what stepping them one by one adds up to)."""
        if steps <= 0:
            return 0.0
        fixed, per_context = self._step_terms(running)
        mean_context = avg_context_tokens + (steps - 1) * growth / 2
        return steps * (fixed + per_context * mean_context)

    def graphed(self, running: int) -> bool:
        """Whether a decode batch of this size replays a CUDA graph (else it runs eager)."""
        return self.graph_max_bs <= 0 or running <= self.graph_max_bs

    def _attention_s(self, context_tokens: float) -> float:
        """MLA attention's compute over the batch's context (0 where it is not MLA or the
        GPU's share of peak for it was never measured)."""
        eff = self.calibration.mla_attention_efficiency
        if eff <= 0 or self.attention_flops_per_token <= 0:
            return 0.0
        return context_tokens * self.attention_flops_per_token / (self.bf16_flops * eff)

    def _moe_s(self, tokens: float) -> float:
        """The routed experts of one step: the weights of the experts its tokens touch, and
        their grouped GEMMs (tokens × top-k rows, at the calibrated share of peak)."""
        if self.moe is None or tokens <= 0:
            return 0.0
        moe = self.moe
        touched = moe.moe_layers * moe.touched_experts(tokens, self.routed_spread)
        compute = tokens * moe.flops_per_token() / (self.bf16_flops
                                                    * self.calibration.moe_efficiency)
        return touched * self.expert_bytes / self.bandwidth_bps + compute

    def prefill_s(self, tokens: int, batches: int = 1) -> float:
        """Seconds to prefill `tokens` new tokens in `batches` forward passes."""
        return (batches * self.calibration.prefill_batch_s
                + tokens * self.flops_per_token / self.peak_flops)

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
    state = cal.state_passes * (conv + ssm)
    if plan.mamba_strategy == "extra_buffer" or plan.mamba_strategy == "extra_buffer_lazy":
        state += cal.extra_buffer_tracking_slots * (conv + ssm)
    draft = plan.draft_tokens
    accept = (accept_len or _prior_accept_len(model, flags)) if draft else 1.0
    accept = min(accept, float(draft)) if draft else 1.0
    tp = flags.tp_size
    routed = model.moe.routed_params * 2.0 / tp if model.moe else 0.0
    return Roofline(
        weights_bytes=model.weights_gib * (1 << 30) / tp - routed,
        state_bytes_per_request=state,
        kv_bytes_per_token=float(plan.kv_cell_bytes),
        bandwidth_bps=gpu.bandwidth_gbs * 1e9 * cal.bandwidth_efficiency,
        flops_per_token=2.0 * model.active_params_b * 1e9 / tp,
        peak_flops=gpu.bf16_tflops * 1e12 * cal.prefill_efficiency,
        overlap=plan.overlap_schedule,
        accept_len=accept,
        spec_factor=1.0 + SPEC_COST_PER_DRAFT_TOKEN * draft,
        calibration=cal,
        moe=model.moe,
        expert_bytes=model.moe.expert_params * 2.0 / tp if model.moe else 0.0,
        graph_max_bs=plan.graph_max_bs,
        num_layers=model.num_layers,
        routed_spread=routed_spread(model, flags, cal),
        linear_layers=model.num_linear_layers,
        bf16_flops=gpu.bf16_tflops * 1e12,
        attention_flops_per_token=mla_flops_per_token(model) / tp,
    )


def mla_flops_per_token(model: ModelProfile) -> float:
    """FLOPs of one context token in one decode step of MLA attention: every full layer's
    query heads take a dot product with its latent (QK) and a weighted sum of it (PV) — two
    multiply-adds per latent element (kv_lora_rank + rope dims, mla_kv_dim)."""
    if model.mla_kv_dim <= 0:
        return 0.0
    return 4.0 * model.num_kv_heads * model.mla_kv_dim * model.num_full_layers


def dummy_weights(flags: ServerFlags) -> bool:
    """Whether the server loads random weights (`--load-format dummy`)."""
    args = flags.extra_args
    return any(a == "--load-format=dummy" or (a == "--load-format" and i + 1 < len(args)
                                             and args[i + 1] == "dummy")
               for i, a in enumerate(args))


def _prior_accept_len(model: ModelProfile, flags: ServerFlags) -> float:
    """Tokens an MTP step writes before any is measured: the model's typical figure, or 1
    under random weights — a random draft head's guesses are rejected, so each step pays
    for the drafts and keeps only the bonus token (real 0.5.17, the 27B's EAGLE 3/1 with
    dummy weights: accept length ≈ 1, `../shared/real-sglang/README.md`)."""
    return 1.0 if dummy_weights(flags) else model.mtp_accept_len


def routed_spread(model: ModelProfile, flags: ServerFlags, cal: StepCalibration) -> float:
    """1.0 for real weights; under `--load-format dummy` the spread measured for the
    architecture, else what its router implies (`dummy_spread_prior`)."""
    if not dummy_weights(flags):
        return 1.0
    measured = dict(cal.dummy_routed_spread).get(model.architecture)
    return measured if measured is not None else dummy_spread_prior(model)


def dummy_spread_prior(model: ModelProfile) -> float:
    """A random-weight router that adds a per-expert bias sends every token to the same top-k
    experts (router_tables.py says why): top-k / experts. One without (or unknown): 1.0.
    Priced this way, Nemotron-30B's four blind H100 waves move from 39-63 % low to 8-16 % low
    under the H200's entry (bench/real_sglang/borrowed_entries.py)."""
    moe = model.moe
    if moe is None or not moe.biased_router:
        return 1.0
    return moe.top_k / moe.num_experts
