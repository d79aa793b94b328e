"""Every configuration one move can reach: the levers' product, not a short list.

A tuner that scores only single levers and a few hand-picked pairs needs two restarts where
one would do (no_buffer, then MTP), and on a job too short to pay for the second it stops
at 0.77 of what one combined move would have reached (bench/tuning.py long-mixed at time
scale 20). So a proposal scores the product of the levers — mamba strategy × mem fraction ×
mamba share × request cap × MTP — and the policy (tasks/tuning/policy.py) fits each to its
KV pool, lifts its CUDA graphs to its cap, drops what the release or the job refuses, and
ranks what is left. Lossy numerics (bf16 SSM state) stay single-lever moves
(planner.candidate_flags), allowed only where the job says so: a move that changes the
outputs is measured on its own, not folded into a sizing move's gain.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from infra.sglang.flags import ServerFlags, scaled_ratio
from infra.sglang.hardware import Hardware
from infra.sglang.memory import MemoryPlan
from infra.sglang.planner import predict_tok_s
from infra.sglang.profiles import ModelProfile
from infra.sim.predict import Workload
from tasks.tuning.trust import ModelTrust

MEM_FRACTIONS = (0.85, 0.88, 0.90, 0.93)  # plus the current value and the ceiling
MAMBA_SHARE_FACTORS = (1.5, 2, 3, 4, 6)  # × the current mamba_full_memory_ratio
LIFTED_CAP = 256  # --max-running-requests when a build's default caps the bigger pools
MTP = {"speculative_algorithm": "EAGLE", "speculative_num_steps": 3,
       "speculative_eagle_topk": 1}
MTP_OFF = dict.fromkeys((*MTP, "speculative_num_draft_tokens"))


def lever_moves(model: ModelProfile, flags: ServerFlags, plan: MemoryPlan | None,
                mem_ceiling: float) -> list[tuple[str, ServerFlags]]:
    """(label, flags) for every combination of the levers this model has, the current
    configuration itself left out."""
    out = []
    for changes in _combinations(model, flags, plan, mem_ceiling):
        changes = {k: v for k, v in changes.items() if getattr(flags, k) != v}
        if changes:
            out.append((_label(changes, flags), flags.with_changes(**changes)))
    return out


def _combinations(model: ModelProfile, flags: ServerFlags, plan: MemoryPlan | None,
                  mem_ceiling: float) -> Iterator[dict[str, object]]:
    current_mem = flags.mem_fraction_static or (plan.mem_fraction_static if plan else None)
    mems = sorted({m for m in (current_mem, *MEM_FRACTIONS, mem_ceiling)
                   if m is not None and m <= mem_ceiling})
    request_caps = [flags.max_running_requests, LIFTED_CAP]
    for mem, cap, mtp in itertools.product(mems, dict.fromkeys(request_caps),
                                           _mtp_choices(model, flags)):
        base: dict[str, object] = {"mem_fraction_static": mem, "max_running_requests": cap,
                                   **mtp}
        if not model.hybrid:
            yield base
            continue
        for strategy, share in itertools.product(("no_buffer", "extra_buffer"),
                                                 _mamba_shares(flags)):
            yield {**base, "mamba_strategy": strategy, **share}


def _mtp_choices(model: ModelProfile, flags: ServerFlags) -> list[dict[str, object]]:
    """Keep what the fleet runs; where the model has draft layers, also the other way."""
    if flags.speculative:
        return [{}, MTP_OFF]
    return [{}, MTP] if model.draft_layers else [{}]


def _mamba_shares(flags: ServerFlags) -> list[dict[str, object]]:
    """The mamba pool's share as it is, and scaled up; a pinned slot count is kept (its own
    single-lever move, planner.candidate_flags, scales it)."""
    if flags.max_mamba_cache_size is not None:
        return [{}]
    ratio = flags.mamba_full_memory_ratio or 0.9
    scaled: list[dict[str, object]] = [{"mamba_full_memory_ratio": scaled_ratio(ratio, f)}
                                       for f in MAMBA_SHARE_FACTORS]
    return [{}, *scaled]


def _label(changes: dict[str, object], flags: ServerFlags) -> str:
    """What the move changes, as the tuner's log and the ledger say it."""
    parts = []
    if "mamba_strategy" in changes:
        parts.append(str(changes["mamba_strategy"]))
    if "mamba_full_memory_ratio" in changes:
        before = flags.mamba_full_memory_ratio or 0.9
        after = changes["mamba_full_memory_ratio"]
        assert isinstance(after, float)
        parts.append(f"mamba share ×{after / before:.2g}")
    if "mem_fraction_static" in changes:
        parts.append(f"mem fraction {changes['mem_fraction_static']:g}")
    if "max_running_requests" in changes:
        parts.append(f"MRR {changes['max_running_requests'] or 'default'}")
    if "speculative_algorithm" in changes:
        parts.append("MTP on (EAGLE 3/1)" if changes["speculative_algorithm"] else "MTP off")
    return " + ".join(parts)


PRESCREEN = 24  # candidates replayed at the mean answer, of those the decode rate ranks best


def prescreened(fitted: list[tuple[str, ServerFlags, MemoryPlan]], hw: Hardware,
                workload: Workload | None,
                trust: ModelTrust | None) -> list[tuple[str, ServerFlags, MemoryPlan]]:
    """The PRESCREEN candidates whose closed-form decode rate (the step model at the cap, at
    the workload's mean context; discounted as the replay's figure will be where the move
    explores) is best. A replay per candidate for the whole lever space cost a 2-core box's
    tuning e2e tests a quarter of a core at every check; the decode rate misses prefill,
    waves and retractions, so it only orders, and the replay ranks what it keeps (the same
    picks as replaying every move in bench/proposal_time.py and long-mixed)."""
    if workload is None or len(fitted) <= PRESCREEN:
        return fitted
    context = workload.prompt_tokens + workload.output_tokens / 2

    def rate(plan: MemoryPlan, candidate: ServerFlags) -> float:
        tok_s = predict_tok_s(hw.model, hw.gpu, candidate, plan, context)
        explores = trust is not None and trust.explores(plan.max_running_requests)
        return tok_s * trust.discount if trust is not None and explores else tok_s

    return sorted(fitted, key=lambda f: rate(f[2], f[1]), reverse=True)[:PRESCREEN]
