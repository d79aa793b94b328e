"""The next configuration to try: moves over the memory model and the step-time model,
filtered by the ledger, and the gain a restart must promise to pay for itself.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace

from infra.sglang.flags import ServerFlags, scaled_ratio
from infra.sglang.hardware import Hardware
from infra.sglang.launch import UnsupportedFlags, check_flags
from infra.sglang.memory import MemoryPlan, PoolsDoNotFit, covering_graphs
from infra.sglang.planner import MAX_MEM_FRACTION, Demand, candidate_flags
from infra.sglang.profiles import ModelProfile
from infra.sglang.roofline import build_roofline
from infra.sglang.versions import SGLangVersion
from tasks.fleet_config import FleetConfig
from tasks.tuning.diagnosis import Diagnosis
from tasks.tuning.ledger import config_key
from tasks.tuning.lever_space import lever_moves, prescreened
from tasks.tuning.trust import ModelTrust, measured_trust

DECODE_RATE = Demand()  # no workload known: the decode rate at 2,048 tokens of context


@dataclass(frozen=True)
class PrefixReuse:
    """What the prefix cache saved so far (from the committed rows' cached_tokens), so a move
    that loses it is predicted with that loss."""

    cached_share: float  # cached / prompt tokens
    prompt_per_output: float  # prompt tokens per output token
    primed: bool = False  # groups are primed on no_buffer servers: no_buffer keeps the reuse

    @classmethod
    def measured(cls, prompt_tokens: int, cached_tokens: int, output_tokens: int,
                 primed: bool = False) -> PrefixReuse | None:
        if prompt_tokens <= 0 or output_tokens <= 0 or cached_tokens <= 0:
            return None
        return cls(cached_tokens / prompt_tokens, prompt_tokens / output_tokens, primed)


def branching_reuse(strategy: str, disable_radix_cache: bool, primed: bool = False) -> bool:
    """Whether a prompt can resume from where it branches off a cached one: every strategy
    but no_buffer, which keeps states only where cached sequences end (real SGLang: 71.5 %
    of prompt tokens reused under extra_buffer, 5.0 % under no_buffer, same prompts) —
    unless each group's shared prefix is sent first (`primed`; real: 98.5 %)."""
    return not disable_radix_cache and (strategy != "no_buffer" or primed)


def with_lost_reuse(tok_s: float, reuse: PrefixReuse | None, before: bool, after: bool,
                    prefill_tok_s: float) -> float:
    """Output tok/s once the cached prompt tokens must be prefilled again: each output token
    then also pays cached_share × prompt_per_output prompt tokens at the prefill rate."""
    if reuse is None or not before or after or tok_s <= 0 or prefill_tok_s <= 0:
        return tok_s
    extra = reuse.cached_share * reuse.prompt_per_output / prefill_tok_s
    return 1.0 / (1.0 / tok_s + extra)


@dataclass(frozen=True)
class Proposal:
    flags: ServerFlags
    concurrency: int | None  # None: each server's cap + queue_target
    predicted_tok_s_per_gpu: float | None
    reason: str
    predicted_gain: float | None = None  # over the model's figure for the current config

    @property
    def config(self) -> FleetConfig:
        """What a canary or a restart would run."""
        return FleetConfig(self.flags, self.concurrency)


def _combined_moves(model: ModelProfile, flags: ServerFlags, plan: MemoryPlan | None,
                    mem_ceiling: float) -> list[tuple[str, ServerFlags]]:
    """Two-lever moves worth trying for throughput jobs, beyond the single levers."""
    if not model.hybrid:
        return []
    m = min(mem_ceiling, max(flags.mem_fraction_static or 0.0, 0.90))
    ratio = flags.mamba_full_memory_ratio or 0.9
    out = [("no_buffer + mem fraction + MRR 256", flags.with_changes(
        mamba_strategy="no_buffer", mem_fraction_static=m, max_running_requests=256,
        max_mamba_cache_size=None))]
    if plan is not None and plan.binding_limit == "mamba":
        out.append(("more mamba share + mem fraction", flags.with_changes(
            mamba_full_memory_ratio=scaled_ratio(ratio, 2), mem_fraction_static=m,
            max_running_requests=256, max_mamba_cache_size=None)))
        out.append(("no_buffer + more mamba share + mem fraction", flags.with_changes(
            mamba_strategy="no_buffer", mamba_full_memory_ratio=scaled_ratio(ratio, 2),
            mem_fraction_static=m, max_running_requests=256, max_mamba_cache_size=None)))
        # Where the mamba pool binds, how far to shift memory to it is a sizing question the
        # memory model answers: one cycle should land on the best split, not on the first
        # step towards it (the next step is then often below min_predicted_gain, and the job
        # stays at 95 % of what it could do: bench/tuning.py canary-4).
        # Each with SGLang's default request cap and with it lifted to 256: a build whose
        # default is below what the bigger pool holds (seed-004's B200 build: 48) would
        # otherwise cap the move where the last one had lifted it (bench/seed_scale.py).
        for mult, mem, mrr in itertools.product((3, 4, 6), sorted({m, mem_ceiling}),
                                                (None, 256)):
            out.append((f"no_buffer + mamba share ×{mult} + mem fraction {mem:g}"
                        + (f" + MRR {mrr}" if mrr else ""),
                        flags.with_changes(mamba_strategy="no_buffer",
                                           mamba_full_memory_ratio=scaled_ratio(ratio, mult),
                                           mem_fraction_static=mem, max_running_requests=mrr,
                                           max_mamba_cache_size=None)))
    if flags.speculative and plan is not None and plan.binding_limit == "mamba":
        slots = (flags.max_mamba_cache_size or plan.mamba_slots) * 2
        out.append((f"mamba slots {plan.mamba_slots}→{slots} + ratio + mem fraction",
                    flags.with_changes(max_mamba_cache_size=slots, mem_fraction_static=m,
                                       mamba_full_memory_ratio=scaled_ratio(ratio, 1.5),
                                       max_running_requests=max(64, slots // plan.slot_ratio))))
    return out


PREFILL_PROBE_TOKENS = 8192  # a batch size at which the roofline's prefill rate is read

# What sizes a server's memory: on a GPU shared by several servers only moves that leave
# these as they are can be planned (each server's pools are pinned by the user).
MEMORY_FIELDS = ("mem_fraction_static", "max_total_tokens", "max_mamba_cache_size",
                 "mamba_full_memory_ratio", "mamba_ssm_dtype", "kv_cache_dtype")


def pools_pinned(flags: ServerFlags, hybrid: bool) -> bool:
    """Whether each server's pools are fixed by flags rather than by the GPU's free memory."""
    return flags.max_total_tokens is not None and (
        not hybrid or flags.max_mamba_cache_size is not None)


def keep_memory(candidate: ServerFlags, flags: ServerFlags) -> ServerFlags:
    """The candidate's other levers with the current memory flags."""
    return candidate.with_changes(**{f: getattr(flags, f) for f in MEMORY_FIELDS})


def fit_to_kv(label: str, candidate: ServerFlags, plan: MemoryPlan, demand: Demand,
              hw: Hardware) -> tuple[str, ServerFlags, MemoryPlan]:
    """The candidate with the cap its KV pool holds: cap × (prompt + expected output) must
    fit, or SGLang admits more than it can finish and retracts (re-prefilling each retracted
    request, output included). Unchanged without a known workload, or when it fits."""
    if demand.workload is None:
        return label, candidate, plan
    per_request = demand.workload.kv_per_request()  # the answers' tail included
    fit = plan.kv_holds(per_request)
    if fit >= plan.max_running_requests:
        return label, candidate, plan
    capped = candidate.with_changes(max_running_requests=fit)
    return (f"{label}, capped at {fit} (what the KV pool holds at {per_request:,} tokens a "
            "request)", capped, hw.memory_plan(capped))


def graphs_for_cap(label: str, candidate: ServerFlags, plan: MemoryPlan,
                   hw: Hardware) -> tuple[str, ServerFlags, MemoryPlan]:
    """A candidate whose cap runs past its decode CUDA graphs (the size the user pinned, or
    SGLang's default for the GPU: 256 on an H200) gets graphs up to its cap: the larger
    batches would run eager — slower than the start on real SGLang (the 35B-A3B's no_buffer +
    bf16 move at cap 313: 2,874 committed tok/s eager against 3,847 at the default; 4,798 with
    graphs to 320), or dead of CUDA OOM (Kimi-Linear at cap 320), and the memory model plans
    the graphs' reserve (MemoryPlan.graph_max_bs)."""
    lifted = covering_graphs(candidate, plan)
    if lifted is None:
        return label, candidate, plan
    return (f"{label}, CUDA graphs up to {plan.max_running_requests} (were {plan.graph_max_bs}: "
            "larger batches run eager)", lifted, hw.memory_plan(lifted))


@dataclass(frozen=True)
class Search:
    """What a proposal is scored against and kept within.

    `tried`: ledger keys never proposed again. `mem_ceiling`: mem_fraction_static stays under
    it (lowered after an OOM). `min_gain`: the least predicted speed-up worth a move.
    `allow_lossy`: numerics (SSM state or KV dtype) may change — a data-generation job should
    not get different outputs because the tuner wanted speed. `pinned` (servers sharing a
    GPU): only the levers that leave each server's memory as it is. `reuse`: a move to a
    strategy that cannot resume from branch points is charged the prefill it brings back."""

    hardware: Hardware
    tried: frozenset[str] = frozenset()
    demand: Demand = DECODE_RATE
    mem_ceiling: float = MAX_MEM_FRACTION
    min_gain: float = 1.1
    allow_lossy: bool = False
    pinned: bool = False
    reuse: PrefixReuse | None = None
    trust: ModelTrust | None = None  # what the fleet measured against the model (trust.py)


def propose(diagnosis: Diagnosis, flags: ServerFlags, concurrency: int | None,
            search: Search) -> Proposal | None:
    """The next configuration to try, or None when nothing promises a gain.

    Never repeats a ledger entry; keeps MTP unless the model predicts that dropping it wins;
    every candidate passes the version's flag checks (SGLang would refuse the rest)."""
    if diagnosis.kind == "client-bound":
        if concurrency is None or config_key(flags, None) in search.tried:
            return None  # already cap + queue: the fleet is just running out of work
        return Proposal(flags, None, None, "client-bound: set client concurrency to each "
                        "server's cap plus a small queue")
    if diagnosis.kind not in ("mamba-bound", "kv-bound", "request-capped", "compute-bound"):
        return None
    hw, demand = search.hardware, search.demand
    current = hw.memory_plan_or_none(flags)
    baseline = (demand.tok_s_per_gpu(hw.model, hw.gpu, flags, current, hw.version)
                if current else 0.0)
    running = [w.running for w in diagnosis.servers if w.alive]
    if running:  # a diagnosis with no server windows has shown the model nothing
        search = replace(search, trust=measured_trust(running, diagnosis.tok_s_per_gpu,
                                                      baseline))
    pool, considered = _scored_candidates(flags, current, search)
    best = _ranked_with_tail(pool, demand, search)
    if best is None or best[0] < search.min_gain * baseline:
        return None
    tok_s, label, chosen = best
    gain = tok_s / baseline if baseline else float("inf")
    return Proposal(chosen, None, tok_s,
                    f"{diagnosis.kind}: {label} — predicted {tok_s:,.0f} tok/s per GPU "
                    f"({gain:.2f}× the model's figure for the current config; "
                    f"{demand.describe()}; best of {considered} moves scored, "
                    f"{len(pool)} replayed)",
                    gain if math.isfinite(gain) else None)


Scored = tuple[float, float, str, ServerFlags, MemoryPlan]  # (tok/s, before reuse, label, ..)


def _allowed(candidate: ServerFlags, flags: ServerFlags, search: Search) -> bool:
    if config_key(candidate, None) in search.tried or candidate == flags:
        return False
    if not search.allow_lossy and (candidate.mamba_ssm_dtype != flags.mamba_ssm_dtype
                                   or candidate.kv_cache_dtype != flags.kv_cache_dtype):
        return False
    if (candidate.mem_fraction_static or 0.0) > search.mem_ceiling:
        return False
    hw = search.hardware
    return accepted_by(candidate, hw.version, hw.model.hybrid)  # else SGLang refuses it


def _scored_candidates(flags: ServerFlags, current: MemoryPlan | None,
                       search: Search) -> tuple[list[Scored], int]:
    """Every allowed move with the rate the mean answer predicts (the prefix reuse it loses
    charged), capped where the KV pool would not hold the answers' tail."""
    hw = search.hardware
    options = (candidate_flags(hw.model, flags, current)
               + _combined_moves(hw.model, flags, current, search.mem_ceiling)
               + lever_moves(hw.model, flags, current, search.mem_ceiling))
    if search.pinned:
        options = [(f"{label} (pools kept)", keep_memory(c, flags)) for label, c in options]
    screen = search.demand.without_tail()
    every = _fitted(options, flags, search)
    fitted = prescreened(every, hw, search.demand.workload, search.trust)
    screen.prefetch(hw.model, hw.gpu, [c for _, c, _ in fitted], hw.version)
    pool: list[Scored] = []
    for label, candidate, plan in fitted:
        raw = screen.tok_s_per_gpu(hw.model, hw.gpu, candidate, plan, hw.version)
        tok_s = raw
        reuse = search.reuse
        if current is not None and reuse is not None:
            roof = build_roofline(hw.model, hw.gpu, candidate, plan)
            tok_s = with_lost_reuse(
                raw, reuse, branching_reuse(current.mamba_strategy, flags.disable_radix_cache,
                                            reuse.primed),
                branching_reuse(plan.mamba_strategy, candidate.disable_radix_cache,
                                reuse.primed),
                PREFILL_PROBE_TOKENS / roof.prefill_s(PREFILL_PROBE_TOKENS))
            if tok_s < raw:
                label += f", with the prefix cache's {reuse.cached_share:.0%} reuse lost"
        trust = search.trust
        if trust is not None and trust.explores(plan.max_running_requests):
            tok_s *= trust.discount
            label += f" ({trust.label(plan.max_running_requests)})"
        pool.append((tok_s, raw, label, candidate, plan))
    return pool, len(every)


def _fitted(options: list[tuple[str, ServerFlags]], flags: ServerFlags,
            search: Search) -> list[tuple[str, ServerFlags, MemoryPlan]]:
    """The allowed options, each once, with the cap its KV pool holds and graphs to it."""
    hw = search.hardware
    out, seen = [], set()
    for label, candidate in options:
        if not _allowed(candidate, flags, search):
            continue
        try:
            label, candidate, plan = fit_to_kv(label, candidate, hw.memory_plan(candidate),
                                               search.demand, hw)
            label, candidate, plan = graphs_for_cap(label, candidate, plan, hw)
        except PoolsDoNotFit:
            continue
        key = config_key(candidate, None)
        if key not in seen:
            seen.add(key)
            out.append((label, candidate, plan))
    return out


def accepted_by(flags: ServerFlags, version: SGLangVersion, hybrid: bool) -> bool:
    try:
        check_flags(flags, version, hybrid)
    except UnsupportedFlags:
        return False
    return True


SHORTLIST = 3  # candidates scored with the answers' tail, of those the mean alone ranks best


def _ranked_with_tail(pool: list[Scored], demand: Demand,
                      search: Search) -> tuple[float, str, ServerFlags] | None:
    """The best candidate. With a tail (p99) in the workload, a replay costs ~10× one at the
    mean (long answers to run out: ~10 s on a busy 2-core box, and a check scores dozens), so
    the mean ranks them and the tail decides among the SHORTLIST best — the tail is what
    tells a cap that fills its KV with long answers (and retracts) from one that does not."""
    if not pool:
        return None
    ranked = sorted(pool, key=lambda p: p[0], reverse=True)
    if demand.without_tail() is demand:
        return ranked[0][0], ranked[0][2], ranked[0][3]
    hw = search.hardware
    rescored = [(demand.tok_s_per_gpu(hw.model, hw.gpu, candidate, plan, hw.version)
                 * adjusted / raw if raw > 0 else 0.0, label, candidate)
                for adjusted, raw, label, candidate, plan in ranked[:SHORTLIST]]
    return max(rescored, key=lambda r: r[0])


# --- when to restart -------------------------------------------------------------------------


def required_gain(remaining_s: float, restart_cost_s: float, floor: float,
                  payback: float) -> float:
    """The least predicted speed-up for which a restart pays for itself.

    A restart costs `restart_cost_s` of fleet time (stop, start-up, drain, in-flight work
    redone); a speed-up g saves remaining_s × (1 − 1/g) on the work left. Require the saving
    to be `payback` × the cost, and g ≥ `floor` (below it the model's own error dominates).
    On a 40-hour job +5 % pays; near the end of a job nothing does (inf)."""
    if remaining_s <= 0:
        return math.inf
    share = payback * restart_cost_s / remaining_s
    if share >= 1.0:
        return math.inf
    return max(floor, 1.0 / (1.0 - share))




@dataclass(frozen=True)
class RestartCost:
    """What a restart of the fleet costs, in seconds of fleet time, and the work it spares."""

    startup_s: float  # this epoch's measured start (the next one is assumed alike)
    drain_s: float  # in-flight requests of completable shards may finish
    stop_s: float  # SGLang exits within seconds of SIGTERM; the grace is only a ceiling
    redo_s: float  # a running request is on average half done when the fleet stops

    @property
    def total_s(self) -> float:
        return self.startup_s + self.drain_s + self.stop_s + self.redo_s


def restart_cost(startup_s: float, drain_timeout_s: float, stop_grace_s: float,
                 tokens_per_prompt: float, max_cap: int, server_tok_s: float) -> RestartCost:
    return RestartCost(startup_s, drain_timeout_s, min(stop_grace_s, 5.0),
                       tokens_per_prompt / 2 * max_cap / server_tok_s)


def gain_to_pay_for_restart(prompts_left: int, tokens_per_prompt: float, server_tok_s: float,
                            servers: int, cost: RestartCost, floor: float,
                            payback: float) -> float:
    """The least predicted speed-up worth a restart now: the work left at the current speed
    of `servers` servers against the restart's cost (required_gain)."""
    if server_tok_s <= 0:
        return floor
    remaining_s = prompts_left * tokens_per_prompt / (server_tok_s * servers)
    return required_gain(remaining_s, cost.total_s, floor, payback)
