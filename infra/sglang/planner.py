"""What-if planning over server flags: the alternatives a user (or the tuning policy) weighs.

Each alternative is the current flags with one lever moved (strategy, mamba share, mem
fraction, MTP, SSM dtype) or three of them together (no_buffer, mem 0.90, cap 128: the fix
the first real run's write-up made by hand), evaluated with the memory model and
the roofline, so they compare on predicted max_running_requests and tok/s per GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from infra.sglang.flags import ServerFlags, scaled_ratio
from infra.sglang.launch import UnsupportedFlags, check_flags
from infra.sglang.memory import MemoryPlan, PoolsDoNotFit, covering_graphs, plan_memory
from infra.sglang.profiles import GpuProfile, ModelProfile
from infra.sglang.roofline import build_roofline
from infra.sglang.versions import SGLangVersion
from infra.sim.predict import Workload, committed_tok_s, prefetch

MAX_MEM_FRACTION = 0.95  # above this, activations and CUDA graphs risk OOM at runtime


@dataclass(frozen=True)
class Alternative:
    label: str
    flags: ServerFlags
    plan: MemoryPlan | None
    tok_s_per_gpu: float | None  # decode only: the roofline at the cap
    error: str | None = None
    committed_tok_s_per_gpu: float | None = None  # for a workload: what the job gets


def predict_tok_s(model: ModelProfile, gpu: GpuProfile, flags: ServerFlags, plan: MemoryPlan,
                  avg_context: float, running: int | None = None) -> float:
    """Steady-state tok/s of one server with `running` (default: its cap) requests."""
    n = plan.max_running_requests if running is None else min(running,
                                                              plan.max_running_requests)
    return build_roofline(model, gpu, flags, plan).tokens_per_s(n, avg_context)


@dataclass(frozen=True)
class Demand:
    """What the job asks of each server, for comparing configurations: with a measured
    workload (the job's mean prompt and output lengths) the committed rate — prefill, waves
    and retractions in (infra/sim/predict.py) —, without one the decode rate at the cap for
    an average context (`tuning.avg_context`), an upper bound that misses prefill."""

    avg_context: float = 2048.0
    workload: Workload | None = None

    def tok_s_per_gpu(self, model: ModelProfile, gpu: GpuProfile, flags: ServerFlags,
                      plan: MemoryPlan, version: SGLangVersion) -> float:
        if self.workload is None:
            return predict_tok_s(model, gpu, flags, plan, self.avg_context)
        return committed_tok_s(model, gpu, flags, version, self.workload) / flags.tp_size

    def prefetch(self, model: ModelProfile, gpu: GpuProfile, candidates: list[ServerFlags],
                 version: SGLangVersion) -> None:
        """Replay every candidate's workload in one trip (nothing to replay for the decode
        rate): the tuner screens a few hundred."""
        if self.workload is not None:
            prefetch(model, gpu, candidates, version, self.workload)

    def without_tail(self) -> Demand:
        """The same workload with every output at its mean: ~10× cheaper to replay (no long
        answers to run out), for screening candidates before the full figure ranks the few
        best (tasks/tuning/policy.py)."""
        if self.workload is None or self.workload.output_p99 is None:
            return self
        return replace(self, workload=replace(self.workload, output_p99=None))

    def describe(self) -> str:
        if self.workload is None:
            return f"decode rate at {self.avg_context:,.0f} tokens of context"
        w = self.workload
        tail = f" (p99 {w.output_p99:,})" if w.output_p99 else ""
        return (f"committed rate for {w.prompt_tokens:,}-token prompts, {w.output_tokens:,} "
                f"out{tail}")


def evaluate(label: str, model: ModelProfile, gpu: GpuProfile, flags: ServerFlags,
             version: SGLangVersion, avg_context: float,
             workload: Workload | None = None) -> Alternative:
    try:
        check_flags(flags, version, model.hybrid)  # (MTP with no_buffer: not before 06-18)
        plan = plan_memory(model, gpu, flags, version)
    except (PoolsDoNotFit, UnsupportedFlags) as exc:
        return Alternative(label, flags, None, None, str(exc))
    committed = (committed_tok_s(model, gpu, flags, version, workload) / flags.tp_size
                 if workload is not None else None)
    return Alternative(label, flags, plan, predict_tok_s(model, gpu, flags, plan, avg_context),
                       committed_tok_s_per_gpu=committed)


def candidate_flags(model: ModelProfile, flags: ServerFlags, current: MemoryPlan | None,
                    kv_per_request: int | None = None) -> list[tuple[str, ServerFlags]]:
    """(label, flags) for each single-lever move that makes sense for this model; with the
    KV tokens a running request holds, a cap raised to what the pools hold counts them."""
    out: list[tuple[str, ServerFlags]] = []
    ratio = flags.mamba_full_memory_ratio or 0.9
    m = flags.mem_fraction_static or (current.mem_fraction_static if current else 0.85)
    if model.hybrid:
        strategy = current.mamba_strategy if current else flags.mamba_strategy
        if strategy != "no_buffer":
            out.append(("no_buffer", flags.with_changes(mamba_strategy="no_buffer",
                                                        max_mamba_cache_size=None)))
        if strategy != "extra_buffer":
            out.append(("extra_buffer", flags.with_changes(mamba_strategy="extra_buffer",
                                                           disable_overlap_schedule=False)))
        if flags.max_mamba_cache_size is None:
            out.append((f"mamba ratio {ratio:g}→{scaled_ratio(ratio, 1.5):g}",
                        flags.with_changes(mamba_full_memory_ratio=scaled_ratio(ratio, 1.5))))
        else:
            more = int(flags.max_mamba_cache_size * 1.5)
            out.append((f"mamba slots {flags.max_mamba_cache_size}→{more}",
                        flags.with_changes(max_mamba_cache_size=more)))
        if flags.mamba_ssm_dtype in (None, "float32") and model.mamba and model.mamba.state_size:
            out.append(("bf16 SSM state", flags.with_changes(mamba_ssm_dtype="bfloat16")))
    if m + 0.05 <= MAX_MEM_FRACTION:
        out.append((f"mem fraction {m:.2f}→{m + 0.05:.2f}",
                    flags.with_changes(mem_fraction_static=round(m + 0.05, 3))))
    if flags.speculative:
        out.append(("MTP off", flags.with_changes(
            speculative_algorithm=None, speculative_num_steps=None, speculative_eagle_topk=None,
            speculative_num_draft_tokens=None)))
    elif model.draft_layers:
        out.append(("MTP on (EAGLE 3/1)", flags.with_changes(
            speculative_algorithm="EAGLE", speculative_num_steps=3, speculative_eagle_topk=1,
            mamba_strategy="extra_buffer" if model.hybrid else flags.mamba_strategy)))
        if model.hybrid and flags.mamba_strategy == "no_buffer":
            # builds after 2026-06-18 (0.5.17) take MTP with no_buffer and the radix cache;
            # where the version refuses, launch.check_flags says so (evaluate, the policy)
            out.append(("MTP on (EAGLE 3/1), no_buffer kept", flags.with_changes(
                speculative_algorithm="EAGLE", speculative_num_steps=3,
                speculative_eagle_topk=1)))
    if current is not None and current.binding_limit == "requested":
        out += _cap_to_the_pools(flags, current, kv_per_request)
    if model.hybrid:
        out += _write_up_fix(flags, m, current)
    return out


def _cap_to_the_pools(flags: ServerFlags, current: MemoryPlan, kv_per_request: int | None,
                      ) -> list[tuple[str, ServerFlags]]:
    """The requested cap raised to what the pools hold (`MemoryPlan.pools_hold`) and, for a
    known workload, to no more requests than the KV pool carries (LFM2's conv slots hold
    57,053 requests where its KV holds 1,782 of 1,280 tokens). None where that is no more
    than the cap already is."""
    room = current.pools_hold
    held = ""
    if kv_per_request:
        room = min(room, current.kv_holds(kv_per_request))
        held = f" at {kv_per_request:,} tokens a request"
    if room <= current.max_running_requests:
        return []
    return [(f"max_running_requests {current.max_running_requests}→{room} (what the pools "
             f"hold{held})", flags.with_changes(max_running_requests=room))]


def _write_up_fix(flags: ServerFlags, mem: float,
                  current: MemoryPlan | None) -> list[tuple[str, ServerFlags]]:
    """The first real run's hand fix (no_buffer, mem 0.90, cap 128), named by what it moves
    here: a fraction already past 0.90 stays, and a fix that moves nothing is no alternative."""
    parts = [("no_buffer", flags.mamba_strategy != "no_buffer"),
             (f"mem {max(mem, 0.90):.2f}", mem < 0.90),
             ("cap 128", flags.max_running_requests != 128)]
    moved = [name for name, changes in parts if changes]
    held = current.max_running_requests if current is not None else None
    if not moved or (moved == ["cap 128"] and held is not None and held <= 128):
        return []  # a cap of 128 over pools that hold no more changes nothing
    return [(" + ".join(moved) + (" together" if len(moved) > 1 else ""), flags.with_changes(
        mamba_strategy="no_buffer", mem_fraction_static=max(mem, 0.90),
        max_running_requests=128, max_mamba_cache_size=None))]


def alternatives(model: ModelProfile, gpu: GpuProfile, flags: ServerFlags,
                 version: SGLangVersion, avg_context: float = 2048.0,
                 workload: Workload | None = None) -> list[Alternative]:
    """The current flags first, then every candidate move, evaluated the same way."""
    current = evaluate("current", model, gpu, flags, version, avg_context, workload)
    rows = [current]
    kv = workload.kv_per_request() if workload is not None else None
    for label, candidate in candidate_flags(model, flags, current.plan, kv):
        row = evaluate(label, model, gpu, candidate, version, avg_context, workload)
        if row.plan is not None and not row.plan.graphs_cover_cap:
            # a cap past the graphs would run eager: raise them with it
            lifted = covering_graphs(candidate, row.plan) or candidate
            row = evaluate(f"{label}, CUDA graphs up to {row.plan.max_running_requests}",
                           model, gpu, lifted, version, avg_context, workload)
        rows.append(row)
    return rows
