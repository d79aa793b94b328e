"""Diagnosis and policy are pure functions: plain values in, decisions with evidence out."""

from __future__ import annotations

from pathlib import Path

from infra.sglang.flags import ServerFlags
from infra.sglang.hardware import Hardware
from infra.sglang.memory import plan_memory
from infra.sglang.profiles import gpu_profile, model_profile
from infra.sglang.versions import parse_version
from tasks.monitor import Sample
from tasks.tuning.decide import EpochReport, decide_next
from tasks.tuning.diagnosis import Diagnosis, ServerWindow, diagnose, pools_from_caps, window_stats
from tasks.tuning.ledger import LedgerEntry, TuningLedger, config_key
from tasks.tuning.policy import Search, propose
from tasks.tuning.watch import WatchResult

FP8 = model_profile("qwen3.6-27b-fp8")
RTX = gpu_profile("rtx-pro-6000")
V = parse_version("0.5.23")
HW = Hardware(FP8, RTX, V)
EB = ServerFlags(mamba_strategy="extra_buffer")
EB_PLAN = plan_memory(FP8, RTX, EB, V)


def w(name: str = "s0", running: float = 31, queued: float = 1, kv: float | None = 0.03,
      mamba: float | None = 0.59, tok: float = 500.0, alive: bool = True) -> ServerWindow:
    return ServerWindow(name, alive, running, queued, kv, mamba, tok)


def test_seed_000_picture_is_mamba_bound() -> None:
    d = diagnose([w("s0"), w("s1")], {"s0": 31, "s1": 31}, EB_PLAN)
    assert d.kind == "mamba-bound"
    assert "157 slots / 5 per request under extra_buffer" in d.evidence
    assert "KV 3%" in d.evidence and "mamba 59%" in d.evidence


def test_free_slots_and_empty_queue_is_client_bound() -> None:
    d = diagnose([w(running=12, queued=0)], {"s0": 31}, EB_PLAN)
    assert d.kind == "client-bound" and "raise client concurrency" in d.evidence


def test_a_short_prefill_queue_beside_thousands_of_free_slots_is_client_bound() -> None:
    """LFM2-8B-A1B at its default cap of 4,096 on a simulated H100 ran 163 with 11 waiting
    their prefill: the client offered ~175, and "at the cap with pool headroom" was wrong."""
    d = diagnose([w(running=162.8, queued=10.9, kv=0.02, mamba=0.0)], {"s0": 4096}, None)
    assert d.kind == "client-bound" and "only a short prefill queue" in d.evidence
    # a cap of 32 turning over fast keeps a real queue beside a near-full batch: pressed
    assert diagnose([w(running=26.6, queued=2.6)], {"s0": 32}, None).kind == "compute-bound"


def test_a_long_queue_beside_free_slots_is_admission_bound() -> None:
    d = diagnose([w(running=1000, queued=2000, kv=0.3, mamba=0.0)], {"s0": 4096}, None)
    assert d.kind == "admission-bound" and "a memory move will not help" in d.evidence


def test_full_kv_is_kv_bound() -> None:
    d = diagnose([w(kv=0.92, mamba=0.2)], {"s0": 31}, None)
    assert d.kind == "kv-bound"


def test_at_cap_with_headroom_is_compute_bound() -> None:
    d = diagnose([w(kv=0.2, mamba=0.2)], {"s0": 31}, None)
    assert d.kind == "compute-bound"


def test_one_slow_gpu_is_asymmetric_and_a_dead_one_unhealthy() -> None:
    d = diagnose([w("s0"), w("s1"), w("s2", tok=200.0)], {"s0": 31, "s1": 31, "s2": 31},
                 EB_PLAN)
    assert d.kind == "asymmetric" and "s2" in d.evidence
    # the same rates at the job's end, s2 with nothing left queued: not a slow GPU
    idle = diagnose([w("s0"), w("s1"), w("s2", tok=200.0, queued=0, running=12)],
                    {"s0": 31, "s1": 31, "s2": 31}, EB_PLAN)
    assert idle.kind != "asymmetric"
    # a slow GPU whose client refills slowly (a loaded box): no queue, but it holds as many
    # requests as the others and makes 0.4× the tokens — still slow
    starved = diagnose([w("s0", queued=0, running=28), w("s1", queued=0, running=27),
                        w("s2", tok=200.0, queued=0, running=31)],
                       {"s0": 31, "s1": 31, "s2": 31}, EB_PLAN)
    assert starved.kind == "asymmetric" and "s2" in starved.evidence
    d = diagnose([w("s0"), w("s1", alive=False)], {"s0": 31}, EB_PLAN)
    assert d.kind == "unhealthy" and "s1" in d.evidence


def test_window_rate_is_committed_tokens_not_the_decode_only_gauge() -> None:
    """As on the H200: the gauge reads decode time only, well above what is committed."""
    samples = [Sample(t, 1, "s0", True, 31, 1, 0.03, 0.59, 2406.0, 1673.0 * 20 * t)
               for t in range(10)]
    (win,) = window_stats(samples, since=2, time_scale=20.0)
    assert win.tok_s == 1673.0 and win.running == 31
    # A window too short for the counter falls back to the gauge.
    (short,) = window_stats(samples, since=7, time_scale=20.0)
    assert short.tok_s == 2406.0


def test_policy_moves_a_mamba_bound_fleet_to_no_buffer_or_more_mamba() -> None:
    diag = Diagnosis("mamba-bound", "", 500.0)
    p = propose(diag, EB, 32, Search(HW))
    assert p is not None
    assert p.flags.mamba_strategy == "no_buffer" or (p.flags.mamba_full_memory_ratio or 0) > 0.9
    assert p.concurrency is None  # cap + queue_target
    assert p.predicted_tok_s_per_gpu and p.predicted_tok_s_per_gpu > 1.2 * 495


def test_policy_never_repeats_and_respects_the_mem_ceiling() -> None:
    diag = Diagnosis("mamba-bound", "", 500.0)
    first = propose(diag, EB, 32, Search(HW))
    assert first is not None
    second = propose(diag, EB, 32, Search(HW, tried=frozenset({config_key(first.flags, None)}),
                                         mem_ceiling=0.85))
    assert second is not None and second.flags != first.flags
    assert (second.flags.mem_fraction_static or 0.0) <= 0.85


def test_policy_keeps_mtp() -> None:
    b200, qwen = gpu_profile("b200"), model_profile("Qwen/Qwen3.6-27B")
    flags = ServerFlags(mamba_strategy="extra_buffer", max_mamba_cache_size=80,
                        speculative_algorithm="EAGLE", speculative_num_steps=3,
                        speculative_eagle_topk=1)
    p = propose(Diagnosis("mamba-bound", "", 2000.0), flags, 64,
                Search(Hardware(qwen, b200, parse_version("main"))))
    assert p is not None and p.flags.speculative_algorithm == "EAGLE"


def test_client_bound_with_auto_concurrency_proposes_nothing() -> None:
    assert propose(Diagnosis("client-bound", "", 1.0), EB, None, Search(HW)) is None
    p = propose(Diagnosis("client-bound", "", 1.0), EB, 8, Search(HW))
    assert p is not None and p.flags == EB and p.concurrency is None


def test_oom_lowers_the_ceiling_and_rolls_back_to_the_best(tmp_path: Path) -> None:
    ledger = TuningLedger(tmp_path / "tuning.jsonl")
    ledger.record(LedgerEntry(1, EB.model_dump(mode="json"), config_key(EB, 32), 32,
                              "measured", 500.0, None, "", 0.0))
    bad = EB.with_changes(mamba_strategy="no_buffer", mem_fraction_static=0.9)
    report = EpochReport(2, bad, None, None, "torch.OutOfMemoryError: CUDA out of memory")
    nxt, ceiling = decide_next(report, ledger, Search(HW, min_gain=1.2), 0.95)
    assert nxt is not None and nxt.flags == EB and nxt.concurrency == 32
    assert EB_PLAN.mem_fraction_static < ceiling < 0.9
    assert [e.outcome for e in ledger.entries()] == ["measured", "failed"]


def test_rollback_returns_to_the_best_config(tmp_path: Path) -> None:
    ledger = TuningLedger(tmp_path / "tuning.jsonl")
    ledger.record(LedgerEntry(1, EB.model_dump(mode="json"), config_key(EB, 32), 32,
                              "measured", 900.0, None, "", 0.0))
    worse = EB.with_changes(mamba_ssm_dtype="bfloat16")
    result = WatchResult(True, "rollback: slower", Diagnosis("mamba-bound", "", 400.0), 400.0)
    nxt, _ = decide_next(EpochReport(2, worse, None, result), ledger, Search(HW, min_gain=1.2),
                         0.95)
    assert nxt is not None and nxt.flags == EB


def _line(ledger: TuningLedger, epoch: int, flags: ServerFlags, outcome: str,
          tok_s: float | None) -> None:
    ledger.record(LedgerEntry(epoch, flags.model_dump(mode="json"), config_key(flags, 32), 32,
                              outcome, tok_s, None, "", 0.0))  # type: ignore[arg-type]


def test_a_rerun_resumes_on_the_last_move_and_not_on_an_undone_one(tmp_path: Path) -> None:
    ledger = TuningLedger(tmp_path / "tuning.jsonl")
    assert ledger.resume_point(EB, 32) is None  # a fresh job
    _line(ledger, 1, EB, "measured", 500.0)
    assert ledger.resume_point(EB, 32) is None  # never moved: the user's flags
    nb = EB.with_changes(mamba_strategy="no_buffer")
    _line(ledger, 2, nb, "started", None)
    point = ledger.resume_point(EB, 32)
    assert point is not None and ledger.flags_of(point) == nb
    assert ledger.resume_point(EB, 8) is None  # other flags given: the user's win
    _line(ledger, 2, nb, "rolled_back", 400.0)  # the move measured slower and was undone
    assert ledger.resume_point(EB, 32) is None  # back on the best: the user's own
    bf = EB.with_changes(mamba_ssm_dtype="bfloat16")
    _line(ledger, 3, bf, "measured", 700.0)  # a canary rolled out (no `started` line)
    point = ledger.resume_point(EB, 32)
    assert point is not None and ledger.flags_of(point) == bf
    assert (ledger.last_epoch(), ledger.moves()) == (3, 1)


def test_pools_from_caps_reads_a_live_server() -> None:
    view = pools_from_caps(31, 157, "extra_buffer")
    assert view is not None and view.binding_limit == "mamba" and view.slot_ratio == 5
    assert pools_from_caps(128, None, None) is None


def test_policy_does_not_change_numerics_unless_allowed() -> None:
    diag = Diagnosis("mamba-bound", "", 500.0)
    tried: set[str] = set()
    for _ in range(6):  # walk the policy's choices: none may touch the SSM or KV dtype
        p = propose(diag, EB, 32, Search(HW, tried=frozenset(tried)))
        if p is None:
            break
        assert p.flags.mamba_ssm_dtype is None and p.flags.kv_cache_dtype == "auto"
        tried.add(config_key(p.flags, None))
    # from the best lossless split of this GPU (the policy's own pick), only numerics remain
    lossy = propose(diag, EB.with_changes(mamba_strategy="no_buffer",
                                          mem_fraction_static=0.95,
                                          mamba_full_memory_ratio=5.4), None,
                    Search(HW, allow_lossy=True))
    assert lossy is not None and lossy.flags.mamba_ssm_dtype == "bfloat16"


def test_a_restart_must_pay_back_on_the_work_left() -> None:
    import math

    from tasks.tuning.policy import required_gain

    # 40 h left, a 5-minute restart: any gain above the model-error floor pays.
    assert required_gain(40 * 3600, 300, floor=1.05, payback=3) == 1.05
    # 1 h left: 3 × 300 s must come out of 3,600 s → ≥ 1.33×.
    assert math.isclose(required_gain(3600, 300, floor=1.05, payback=3), 4 / 3)
    # Ten minutes left: nothing pays.
    assert required_gain(600, 300, floor=1.05, payback=3) == math.inf
    assert required_gain(0, 1, floor=1.05, payback=3) == math.inf


def test_restart_cost_and_the_gain_it_asks_for_as_on_the_h200() -> None:
    """The numbers of the real restart (docs/REAL_SGLANG.md): 2,100 prompts × 200 tokens
    left at 1,172 tok/s on one server, an 88.7 s start, cap 23."""
    from tasks.tuning.policy import gain_to_pay_for_restart, required_gain, restart_cost

    cost = restart_cost(88.7, drain_timeout_s=3.0, stop_grace_s=30.0, tokens_per_prompt=200,
                        max_cap=23, server_tok_s=1172.0)
    assert cost.stop_s == 5.0  # SGLang exits in seconds: the grace is only a ceiling
    assert cost.redo_s == 100 * 23 / 1172.0  # half of every running request, redone
    assert cost.total_s == 88.7 + 3.0 + 5.0 + cost.redo_s
    needed = gain_to_pay_for_restart(2100, 200, 1172.0, 1, cost, floor=1.05, payback=1.0)
    assert needed == required_gain(2100 * 200 / 1172.0, cost.total_s, 1.05, 1.0)
    assert 1.3 < needed < 1.4  # the 1.90× move passed; a 1.2× one would not have
    # Twice the servers finish the work in half the time: the same restart must gain more.
    assert gain_to_pay_for_restart(2100, 200, 1172.0, 2, cost, 1.05, 1.0) > needed
    # With no measured speed there is nothing to weigh: the floor.
    assert gain_to_pay_for_restart(2100, 200, 0.0, 1, cost, 1.05, 1.0) == 1.05


def test_watch_asks_for_the_gain_the_work_left_justifies() -> None:
    from tasks.monitor import FleetMonitor, SGLangMetrics
    from tasks.tuning.diagnosis import Diagnosis
    from tasks.tuning.policy import Proposal
    from tasks.tuning.watch import RegressionWatch, WatchTargets

    asked: list[float] = []

    def can_propose(diag: Diagnosis, min_gain: float) -> Proposal | None:
        asked.append(min_gain)
        return Proposal(ServerFlags(mamba_strategy="no_buffer"), None, 2000.0, "x")

    mamba = Diagnosis("mamba-bound", "mamba 0.61, kv 0.20", 500.0)
    need = {"gain": 1.3}
    monitor = FleetMonitor(1.0, None, SGLangMetrics())
    watch = RegressionWatch(monitor, WatchTargets({"server-0": 32}, None, window_s=4.0),
                            True, can_propose, lambda d: need["gain"])
    assert watch._reason(mamba) == "" and asked == []  # no span with a turnover yet: a wave
    assert "turn its batch over" in watch.result.last_check
    watch._turned_over = True  # what _measure sets once every server turned over
    assert watch._reason(mamba).startswith("mamba-bound")
    assert asked == [1.3] and watch.result.required_gain == 1.3
    need["gain"] = float("inf")  # the job is nearly done: no proposal is even asked for
    assert watch._reason(mamba) == "" and asked == [1.3]
    # A rollback is a restart too: not worth it when the best config is barely faster.
    slow = Diagnosis("compute-bound", "", 900.0)
    need["gain"] = 1.2
    watch = RegressionWatch(monitor, WatchTargets(
        {"server-0": 32}, None, window_s=4.0, baseline_tok_s_per_gpu=1000.0),
        True, can_propose, lambda d: need["gain"])
    watch._turned_over = True
    assert watch._reason(slow) == "" and watch._reason(slow) == ""
    need["gain"] = 1.05
    assert watch._reason(slow) == ""  # first slow window
    assert watch._reason(slow).startswith("rollback")


def test_no_buffer_at_its_mamba_cap_is_mamba_bound_though_usage_reads_low() -> None:
    nb = plan_memory(FP8, RTX, ServerFlags(mamba_strategy="no_buffer"), V)
    assert nb.binding_limit == "mamba" and nb.slot_ratio == 3
    cap = nb.max_running_requests
    d = diagnose([w(running=cap, mamba=cap / nb.mamba_slots)], {"s0": cap}, nb)
    assert d.kind == "mamba-bound"
    assert "counts live states" in d.evidence
    seed = diagnose([w()], {"s0": 31}, EB_PLAN)  # extra_buffer at 59 %: no footnote needed
    assert seed.kind == "mamba-bound" and "live states" not in seed.evidence


def test_a_cap_past_the_pinned_cuda_graphs_lifts_them() -> None:
    """Batches above `--cuda-graph-max-bs` run eager, which the step-time model does not
    score (real H200: 0.95× measured where 1.41× was predicted); a candidate whose cap passes
    the pinned size gets graphs up to its cap, in the user's spelling."""
    pinned = ServerFlags(mamba_strategy="extra_buffer", max_running_requests=16,
                         extra_args=("--cuda-graph-max-bs-decode=16", "--load-format", "dummy"))
    assert pinned.graph_max_bs == 16
    assert plan_memory(FP8, RTX, pinned, V).graph_max_bs == 16  # SGLang's log: cuda graph: False
    assert plan_memory(FP8, RTX, EB, V).graph_max_bs == 256  # the GPU's default
    p = propose(Diagnosis("request-capped", "", 500.0), pinned, None, Search(HW))
    assert p is not None and p.flags.max_running_requests != 16
    cap = plan_memory(FP8, RTX, p.flags, V).max_running_requests
    assert p.flags.graph_max_bs == cap > 16
    assert p.flags.extra_args == (f"--cuda-graph-max-bs-decode={cap}", "--load-format", "dummy")
    assert f"CUDA graphs up to {cap} (were 16" in p.reason
    import pytest

    with pytest.raises(ValueError, match="--cuda-graph-max-bs takes a whole number, not 'x'"):
        ServerFlags(extra_args=("--cuda-graph-max-bs", "x"))


def test_a_queue_beside_a_batch_near_its_mamba_cap_is_mamba_bound() -> None:
    """Fixed-length answers finish in waves: real SGLang at the 35B-A3B default (cap 160)
    averaged 137 running with 1.9 queued over a window. The cap binds there as surely as in
    a full batch; read as compute-bound, the tuner never proposed a move."""
    nb = plan_memory(FP8, RTX, ServerFlags(mamba_strategy="no_buffer"), V)
    cap = nb.max_running_requests
    d = diagnose([w(running=0.86 * cap, queued=1.9, mamba=0.4, kv=0.1)], {"s0": cap}, nb)
    assert d.kind == "mamba-bound"
    idle = diagnose([w(running=0.5 * cap, queued=1.9, mamba=0.4, kv=0.1)], {"s0": cap}, nb)
    assert idle.kind != "mamba-bound"  # half the cap with a queue: not the pool


def test_check_log_writes_changed_verdicts_and_one_a_period_otherwise() -> None:
    from tasks.tuning.watch import CheckLog

    lines: list[str] = []
    now = [0.0]
    log = CheckLog(lines.append, every_s=300, clock=lambda: now[0])
    log("hold: compute-bound, no move pays back")
    now[0] = 30
    log("hold: compute-bound, no move pays back")  # same gist within the period: quiet
    now[0] = 60
    log("hold: mamba-bound, best candidate: no_buffer ×1.2 (needs 1.3)")  # a candidate now
    now[0] = 90
    log("propose: mamba-bound, best candidate: no_buffer ×1.4")  # another verdict
    now[0] = 100
    log("propose: mamba-bound, best candidate: no_buffer ×1.4")
    now[0] = 400
    log("propose: mamba-bound, best candidate: no_buffer ×1.4")  # the period has passed
    now[0] = 405
    log("compute-bound at 5,802 tok/s per GPU")  # a flip 5 s after a line: quiet
    assert lines == ["check: hold: compute-bound, no move pays back",
                     "check: hold: mamba-bound, best candidate: no_buffer ×1.2 (needs 1.3)",
                     "check: propose: mamba-bound, best candidate: no_buffer ×1.4",
                     "check: propose: mamba-bound, best candidate: no_buffer ×1.4"]
