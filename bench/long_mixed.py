"""Ground truth for `bench/tuning.py --scenario long-mixed`: what each configuration commits
for the scenario's workload, by the simulator's own scheduler replayed in modeled time
(infra/sim/predict.py) — the engine the simulated fleet runs, so for the simulated job it is
the truth the tuner's readings are judged against, not a second opinion.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Any

from infra.sglang.flags import ServerFlags
from infra.sglang.hardware import Hardware
from infra.sglang.memory import PoolsDoNotFit, plan_memory
from infra.sglang.planner import Demand
from infra.sglang.profiles import gpu_profile, model_profile
from infra.sglang.versions import parse_version
from infra.sim.predict import Workload, committed_tok_s
from infra.sim.text import count_prompt_tokens
from tasks.tuning.lever_space import MTP as TUNER_MTP
from tasks.tuning.policy import fit_to_kv

MTP = {**TUNER_MTP, "speculative_num_draft_tokens": 4}  # the tuner's lever, drafts spelled
RETRACTED = re.compile(r"Retract requests\. #retracted_reqs: (\d+)")


def workload(sc: dict[str, Any]) -> Workload:
    prompt = count_prompt_tokens("bench 1 1 " + "x" * sc.get("prompt_bytes", 0))
    return Workload(prompt, sc["output_mean"], sc["output_p99"])


def true_rate(sc: dict[str, Any], flags: dict[str, Any]) -> float:
    """Committed tok/s per GPU of one server in this configuration, for this workload."""
    model = model_profile(sc["model"], sc.get("weights_gib"))
    server = ServerFlags(**{k: v for k, v in flags.items() if k != "extra_args"})
    return committed_tok_s(model, gpu_profile(sc["gpu"]), server, parse_version(sc["version"]),
                           workload(sc)) / server.tp_size


def committed_sweep(sc: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """The best committed rate over the levers the tuner moves (strategy × mem fraction ×
    mamba share — ×1.5, ×2, ×3, ×4, ×6, the shares the policy proposes — × the request cap
    lifted to 256 as its lever space does (a build whose default cap is below what the pools
    hold: seed-004's B200 read 48 of 69) × MTP (EAGLE 3/1) where the model has draft layers:
    with a reasoning model's tail it beats every mamba move alone; each also with the cap its
    KV pool holds for the workload's lengths)."""
    model = model_profile(sc["model"], sc.get("weights_gib"))
    gpu, version = gpu_profile(sc["gpu"]), parse_version(sc["version"])
    demand = Demand(workload=workload(sc))
    best: tuple[float, dict[str, Any]] = (0.0, {})
    base = ServerFlags(**sc["server"])
    scored: set[tuple[Any, ...]] = set()  # flag sets whose pools come out the same score alike
    drafts = [{}, MTP] if model.draft_layers else [{}]
    for strategy, mem, ratio, mrr, mtp, fit in itertools.product(
            ["extra_buffer", "no_buffer"], [None, 0.9, 0.95], [None, 1.35, 1.8, 2.7, 3.6, 5.4],
            [base.max_running_requests, 256], drafts, [False, True]):
        flags = base.with_changes(mamba_strategy=strategy, mem_fraction_static=mem,
                                  mamba_full_memory_ratio=ratio, max_running_requests=mrr,
                                  **mtp)
        try:
            plan = plan_memory(model, gpu, flags, version)
            if fit:  # the cap the tuner would propose it with (policy.fit_to_kv)
                label, flags, _ = fit_to_kv("", flags, plan, demand, Hardware(model, gpu, version))
                if not label:
                    continue  # it fits as it is: already scored
        except PoolsDoNotFit:
            continue
        pools = plan_memory(model, gpu, flags, version)
        same = (pools.mamba_strategy, pools.max_running_requests, pools.max_total_num_tokens,
                pools.mamba_slots, pools.draft_tokens)
        if same in scored:
            continue
        scored.add(same)
        record = flags.model_dump(exclude_none=True, exclude={"extra_args"})
        tok = true_rate(sc, record)
        if tok > best[0]:
            best = (tok, record)
    return best


def judged_against_truth(sc: dict[str, Any], summary: dict[str, Any],
                         best_tok_s: float) -> dict[str, Any]:
    """The run's decisions against the truth. `wrong_decisions`: a canary rolled back whose
    candidate commits more than the configuration kept (by more than the canary's 3 % bar),
    or rolled out while committing less. `prediction_error`: for each move kept (a rollout or
    a whole-fleet restart), |predicted gain / true gain − 1|, the largest. `ratio_to_best`:
    what the final configuration commits over the sweep's best."""
    current: dict[str, Any] = dict(sc["server"])
    wrong, errors = 0, []
    for cycle in summary["cycles"]:
        candidate = dict(cycle.get("new_flags") or {})
        canary = cycle.get("canary") or {}
        outcome = canary.get("outcome")
        if not candidate or (canary and outcome not in ("rolled_out", "rolled_back")):
            continue
        gain = true_rate(sc, candidate) / true_rate(sc, current)
        wrong += outcome == "rolled_back" and gain > 1.03
        wrong += outcome == "rolled_out" and gain < 1.0
        if outcome == "rolled_out" or not canary:
            predicted = canary.get("predicted_gain") or cycle.get("predicted_gain")
            if predicted:
                errors.append(abs(predicted / gain - 1))
            current = candidate
    final = true_rate(sc, current)
    return {"wrong_decisions": wrong,
            "prediction_error": round(max(errors), 3) if errors else None,
            "final_true_tok_s": round(final, 1),
            "ratio_to_best": round(final / best_tok_s, 3) if best_tok_s else None}


def retractions(servers: Path) -> int:
    """Requests the fleet's servers retracted, from their logs (SGLang's line)."""
    return sum(int(n) for log in servers.glob("*.log")
               for n in RETRACTED.findall(log.read_text(errors="replace")))
