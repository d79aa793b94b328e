"""A move that loses the prefix cache's reuse is predicted with that loss (real SGLang: the
same grouped prompts reused 71.5 % of their tokens under extra_buffer, 5.0 % under no_buffer)."""

from __future__ import annotations

from infra.sglang.flags import ServerFlags
from infra.sglang.hardware import Hardware
from infra.sglang.profiles import gpu_profile, model_profile
from infra.sglang.versions import parse_version
from tasks.tuning.diagnosis import Diagnosis
from tasks.tuning.policy import PrefixReuse, Search, branching_reuse, propose, with_lost_reuse

FP8 = model_profile("qwen3.6-27b-fp8")
RTX = gpu_profile("rtx-pro-6000")
V = parse_version("0.5.23")
HW = Hardware(FP8, RTX, V)
EB = ServerFlags(mamba_strategy="extra_buffer")


def test_only_no_buffer_and_a_disabled_cache_lose_branch_reuse() -> None:
    assert branching_reuse("extra_buffer", False) and branching_reuse("extra_buffer_lazy", False)
    assert not branching_reuse("no_buffer", False)
    assert not branching_reuse("extra_buffer", True)


def test_lost_reuse_costs_its_prefill() -> None:
    reuse = PrefixReuse(cached_share=0.7, prompt_per_output=10.0)
    # 1,000 output tok/s; 7 prompt tokens per output token come back at 14,000 tok/s of
    # prefill: 0.5 ms more per output token -> 666.7 tok/s
    assert abs(with_lost_reuse(1000.0, reuse, True, False, 14_000.0) - 666.67) < 0.1
    assert with_lost_reuse(1000.0, reuse, True, True, 14_000.0) == 1000.0  # kept
    assert with_lost_reuse(1000.0, None, True, False, 14_000.0) == 1000.0  # nothing reused
    assert PrefixReuse.measured(1000, 0, 50) is None


def test_a_prefix_heavy_job_is_not_moved_to_no_buffer_on_a_gain_it_would_lose() -> None:
    diag = Diagnosis("mamba-bound", "", 500.0)
    plain = propose(diag, EB, 32, Search(HW))
    assert plain is not None and plain.flags.mamba_strategy == "no_buffer"
    heavy = PrefixReuse(cached_share=0.9, prompt_per_output=40.0)  # long shared documents
    careful = propose(diag, EB, 32, Search(HW, reuse=heavy))
    # the no_buffer moves now predict less than a move that keeps branch reuse (MTP here)
    assert careful is not None and careful.flags.mamba_strategy == "extra_buffer"
    light = propose(diag, EB, 32, Search(HW, reuse=PrefixReuse(0.05, 2.0)))
    assert light is not None and light.flags.mamba_strategy == "no_buffer"
    assert "reuse lost" in light.reason


def test_a_primed_job_keeps_its_reuse_on_no_buffer() -> None:
    """With prefix affinity on and text prompts, each group's shared prefix goes first to a
    no_buffer server (tasks/affinity.py), so the move loses nothing and is offered."""
    assert branching_reuse("no_buffer", False, primed=True)
    assert not branching_reuse("extra_buffer", True, primed=True)  # no cache at all
    heavy = PrefixReuse(cached_share=0.9, prompt_per_output=40.0, primed=True)
    p = propose(Diagnosis("mamba-bound", "", 500.0), EB, 32, Search(HW, reuse=heavy))
    assert p is not None and p.flags.mamba_strategy == "no_buffer"
    assert "reuse lost" not in p.reason
    assert PrefixReuse.measured(1000, 900, 25, primed=True) == heavy


def test_one_cycle_lands_on_the_best_split_of_memory() -> None:
    """bench/tuning.py canary-4: a first move that only went part way left the job at 95 %
    of the sweep's best (the next step was under min_predicted_gain)."""
    p = propose(Diagnosis("mamba-bound", "", 500.0), EB, 32, Search(HW))
    assert p is not None and p.predicted_tok_s_per_gpu is not None
    assert p.flags.mamba_strategy == "no_buffer" and p.flags.mem_fraction_static == 0.95
    assert p.predicted_tok_s_per_gpu > 1600


def test_mamba_share_moves_stop_at_the_settings_limit() -> None:
    big = EB.with_changes(mamba_strategy="no_buffer", mamba_full_memory_ratio=9.0)
    p = propose(Diagnosis("mamba-bound", "", 500.0), big, None, Search(HW))
    assert p is None or (p.flags.mamba_full_memory_ratio or 0) <= 10.0


def test_a_move_is_proposed_with_the_cap_its_kv_pool_holds_for_the_jobs_lengths() -> None:
    """1,000-token answers on a 24,576-token KV pool: a move's cap times what each request
    ends up holding must fit the pool, else SGLang admits more than it can finish and
    retracts; such a move is proposed with the cap the pool holds (#26, over-admission)."""
    from pathlib import Path

    from infra.sglang.memory import plan_memory
    from infra.sglang.planner import Demand
    from infra.sim.predict import Workload

    tiny = model_profile(str(Path(__file__).parents[1] / "fixtures/models/tiny-qwen3-next"),
                         0.04)
    h200 = gpu_profile("h200")
    flags = ServerFlags(mamba_strategy="extra_buffer", mem_fraction_static=0.2,
                        max_total_tokens=24576, max_mamba_cache_size=50)  # cap 10
    diag = Diagnosis("mamba-bound", "", 500.0)
    moved = propose(diag, flags, None,
                    Search(Hardware(tiny, h200, V), demand=Demand(workload=Workload(64, 1000))))
    assert moved is not None and "capped at 23 (what the KV pool holds" in moved.reason
    plan = plan_memory(tiny, h200, moved.flags, V)
    assert plan.max_running_requests == moved.flags.max_running_requests == 23
    assert plan.max_running_requests * 1064 <= plan.max_total_num_tokens
    short = propose(diag, flags, None,
                    Search(Hardware(tiny, h200, V), demand=Demand(workload=Workload(64, 16))))
    assert short is not None and "capped at" not in short.reason  # short answers fit
