"""The memory model, the simulator's replay and the committed-tok/s prediction against real
SGLang 0.5.17 on the H200: long mixed outputs that retract, and the cap's rate at 1,024 + 256
tokens on two families (bench/real_sglang/data/2026-12-02-h200-s8/, -s9/ and -s10/, from
probe_long.py)."""

from __future__ import annotations

import gzip
import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from infra.sglang.flag_parser import parse_server_flags
from infra.sglang.flags import ServerFlags
from infra.sglang.memory import plan_memory
from infra.sglang.profiles import ModelProfile, gpu_profile, model_profile
from infra.sglang.versions import parse_version
from infra.sim.predict import Workload, committed_tok_s
from infra.sim.replay import replay_requests

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "bench" / "real_sglang" / "data" / "2026-12-02-h200-s8"
DATA_S9 = DATA.with_name("2026-12-02-h200-s9")  # the run that retracts more (session 9)
DATA_S10 = DATA.with_name("2026-12-02-h200-s10")  # NemotronH's cap rerun, long runs (session 10)
DATA_S13 = DATA.with_name("2026-12-02-h200-s13")  # extra_buffer that retracts (session 13)
DATA_S14 = DATA.with_name("2026-12-02-h200-s14")  # answers up to 16k at long-mixed's best (s14)
H200 = gpu_profile("h200")
V0517 = parse_version("0.5.17")
MODELS = {  # the device's model folder → the same shapes here, weights as the log gives them
    "qwen3.6-27b-text": (ROOT / "tests" / "fixtures" / "models" / "qwen3.6-27b-text", 50.16),
    "nemotron-3-nano-4b": (ROOT / "bench" / "real_sglang" / "models" / "nemotron-3-nano-4b",
                           7.47),
}
LAUNCH_ONLY = {"--skip-tokenizer-init"}  # flags that do not change pools or speed


@cache
def servers() -> dict[str, dict[str, Any]]:
    """Every server the device ran, by name, with its runs; a later session's run of a name
    replaces the earlier one (session 10's nh4b_nb: session 8's client idled the server)."""
    out: dict[str, dict[str, Any]] = {}
    for data, name in ((DATA, "long27b"), (DATA, "cal27b"), (DATA, "calnh4b"),
                       (DATA_S9, "long27r"), (DATA_S10, "nh4b_s10"), (DATA_S10, "nh4br_s10"),
                       (DATA_S10, "q27cap_s10"), (DATA_S13, "q27ebr"), (DATA_S14, "q27lm16k")):
        for server in json.loads(gzip.decompress((data / f"{name}.results.json.gz").read_bytes())):
            if "runs" in server:
                out[server["name"]] = server
    return out


def setup(name: str) -> tuple[ModelProfile, ServerFlags, dict[str, Any]]:
    server = servers()[name]
    folder, weights = MODELS[server["model"]]
    argv = [f for f in server["flags"] if f not in LAUNCH_ONLY]
    if "--attention-backend" in argv:  # a kernel choice, not a pool or a speed the model has
        at = argv.index("--attention-backend")
        del argv[at:at + 2]
    return model_profile(str(folder), weights), parse_server_flags(argv), server


GDN_FIXED = ["q27b_nb", "q27b_eb", "q27b_nb_r06", "q27b_nb_mrr32"]
ALL = ["q27b_nb450_kv100k", "q27b_nb450_kv50k", "q27b_eb300_kv50k", *GDN_FIXED, "nh4b_nb",
       "nh4b_nb_r03", "q27b_lm_best"]


@pytest.mark.parametrize("name", ALL)
def test_the_memory_model_gives_the_real_pools(name: str) -> None:
    model, flags, server = setup(name)
    plan = plan_memory(model, H200, flags, V0517)
    assert plan.max_running_requests == server["max_running_requests"]
    assert abs(plan.mamba_slots - server["max_mamba_cache_size"]) <= 1
    assert plan.max_total_num_tokens == pytest.approx(server["max_total_num_tokens"], rel=0.01)


def test_the_long_mixed_run_retracted_and_the_replay_commits_what_it_committed() -> None:
    """300 rows, outputs lognormal up to 8,192 tokens, a 100k-token KV pool at cap 150:
    real SGLang committed 1,485.5 tok/s in 257.6 s and retracted 5 requests."""
    model, flags, server = setup("q27b_nb450_kv100k")
    run = server["runs"][0]
    rows = [(p, o) for p, o in run["requests_list"]]
    assert max(o for _, o in rows) >= 8192 and run["answered"] == len(rows) == 300
    assert run["errors"] == 0 and run["retracted"] > 0
    sim = replay_requests(model, H200, flags, V0517, rows, run["concurrency"])
    assert sim.answered == len(rows)
    assert sim.committed_tok_s == pytest.approx(run["committed_tok_s"], rel=0.15)
    # the replay retracts 5 times too (before SGLang's batch_is_full was modeled: 7–9)
    assert sim.retracted == pytest.approx(run["retracted"], rel=0.15)


def test_a_run_that_retracts_ten_times_is_replayed_within_15_percent() -> None:
    """150 rows, outputs lognormal (mean 1,500, p99 8,000, up to 8,192), a 50k-token KV pool
    at cap 150: real SGLang committed 972.9 tok/s in 244.9 s and retracted 10 requests, each
    alone, the first only after the pool had run near-full for 100 s. The replay: 903.8 tok/s,
    11 retractions — it admits as SGLang does, only after a request finished or was retracted
    once an admission found no room (batch_is_full), and re-queues a retracted request at the
    back (before both: 23 retractions, the first after 50 s)."""
    model, flags, server = setup("q27b_nb450_kv50k")
    run = server["runs"][0]
    rows = [(p, o) for p, o in run["requests_list"]]
    assert run["answered"] == len(rows) == 150 and run["errors"] == 0
    assert run["retracted"] == 10
    sim = replay_requests(model, H200, flags, V0517, rows, run["concurrency"])
    assert sim.answered == len(rows)
    assert sim.committed_tok_s == pytest.approx(run["committed_tok_s"], rel=0.15)
    assert sim.retracted == pytest.approx(run["retracted"], rel=0.15)


@pytest.mark.parametrize("name", [*GDN_FIXED, "nh4b_nb_r03"])
def test_the_replay_of_the_same_rows_commits_within_15_percent(name: str) -> None:
    model, flags, server = setup(name)
    run = server["runs"][0]
    sim = replay_requests(model, H200, flags, V0517, [tuple(r) for r in run["requests_list"]],
                          run["concurrency"])
    assert sim.committed_tok_s == pytest.approx(run["committed_tok_s"], rel=0.15)


def predicted(name: str) -> float:
    model, flags, _ = setup(name)
    return committed_tok_s(model, H200, flags, V0517, Workload(1024, 256))


def real(name: str) -> float:
    return float(servers()[name]["runs"][0]["committed_tok_s"])


PREDICTED_WITHIN_15 = [*GDN_FIXED, "nh4b_nb_r03", "nh4b_nb"]
"""nh4b_nb is session 10's rerun at cap 237: session 8's probe drove 245 workers through one httpx
client (httpcore's pool is O(N²)) and the server idled 3–5 s after each wave (real 3,806.8 tok/s,
predicted 39 % above); with 16 workers a client it committed 4,616.4 tok/s, predicted 5,126
(+11 %, after the mamba2 constants were refitted on this run)."""


@pytest.mark.parametrize("name", PREDICTED_WITHIN_15)
def test_plan_predicts_committed_tok_s_at_1024_plus_256_within_15_percent(name: str) -> None:
    assert predicted(name) == pytest.approx(real(name), rel=0.15)


@pytest.mark.parametrize("start,move", [("q27b_eb", "q27b_nb"), ("q27b_nb", "q27b_nb_mrr32"),
                                        ("q27b_nb", "q27b_nb_r06"), ("q27b_eb", "q27b_nb_r06"),
                                        ("nh4b_nb_r03", "nh4b_nb")])
def test_each_measured_move_is_predicted_within_10_percent(start: str, move: str) -> None:
    """The tuner acts on ratios: extra_buffer → no_buffer was 1.19× real (the decode-only
    roofline said 1.26×, the committed prediction says 1.11×)."""
    measured = real(move) / real(start)
    assert predicted(move) / predicted(start) == pytest.approx(measured, rel=0.10)


@pytest.mark.parametrize("name", ["q27b_nb_cap_long", "nh4b_nb"])
def test_long_mixed_outputs_at_the_cap_are_replayed_within_15_percent(name: str) -> None:
    """Session 10, each at its own cap, outputs lognormal up to 8,192 tokens: the 27B shapes
    (no_buffer, cap 82, mean 2,000, p99 8,000: real 1,662.2 tok/s, replay 1,596.5) and
    NemotronH-4B (cap 237, mean 1,500: real 5,479.6, replay 6,078.5, +11 % as at 1,024 + 256)."""
    model, flags, server = setup(name)
    run = server["runs"][-1]
    assert run["workload"] == "lognormal" and run["answered"] == len(run["requests_list"])
    sim = replay_requests(model, H200, flags, V0517, [tuple(r) for r in run["requests_list"]],
                          run["concurrency"])
    assert sim.committed_tok_s == pytest.approx(run["committed_tok_s"], rel=0.15)


def test_a_mamba2_hybrid_that_retracts_is_replayed_within_15_percent() -> None:
    """NemotronH-4B, a 60k-token KV pool at cap 200, 200 rows lognormal (mean 1,500, p99 8,000):
    real 3,333.7 tok/s, 16 retractions, one request each, in three bursts; the replay 3,306.0
    tok/s and 12 — the count 25 % short, left open in docs/REAL_SGLANG.md (session 10)."""
    model, flags, server = setup("nh4b_nb_kv60k")
    run = server["runs"][0]
    assert run["retracted"] == 16 and run["errors"] == 0
    sim = replay_requests(model, H200, flags, V0517, [tuple(r) for r in run["requests_list"]],
                          run["concurrency"])
    assert sim.answered == len(run["requests_list"])
    assert sim.committed_tok_s == pytest.approx(run["committed_tok_s"], rel=0.15)
    assert 0 < sim.retracted <= run["retracted"]


def test_extra_buffer_that_retracts_is_replayed_answer_for_answer() -> None:
    """The 27B shapes under extra_buffer (`--max-mamba-cache-size 300`: cap 60, 5 slots a
    request) on a 50,000-token pool, 100 rows lognormal (mean 1,500, p99 8,000), 96 clients,
    cut at 140 s: real SGLang answered 93 (887.3 committed tok/s) and retracted 3 requests;
    the replay of the same rows answers 94 (895.5 tok/s) and retracts 3 (session 13)."""
    model, flags, server = setup("q27b_eb300_kv50k")
    run = server["runs"][0]
    assert (run["answered"], run["retracted"], run["errors"]) == (93, 3, 0)
    sim = replay_requests(model, H200, flags, V0517, [tuple(r) for r in run["requests_list"]],
                          run["concurrency"], max_s=run["wall_s"])
    assert abs(sim.answered - run["answered"]) <= 2
    assert sim.committed_tok_s == pytest.approx(run["committed_tok_s"], rel=0.05)
    assert sim.retracted == run["retracted"]


def test_answers_up_to_16k_at_long_mixeds_best_are_replayed_within_15_percent() -> None:
    """The configuration `bench/tuning.py --scenario long-mixed` scores best (no_buffer, mamba
    ratio 1.8, mem fraction 0.95: cap 122, 366 slots) with that scenario's answers (lognormal,
    mean 2,000, p99 16,000, up to 16,384), 400 rows at 122 clients, cut at 349 s: real SGLang
    answered 393 and committed 1,729.9 tok/s, no retraction; the replay 390, 1,626.7 (−6 %) —
    the scenario's truth holds at its own lengths, tail included (session 14)."""
    model, flags, server = setup("q27b_lm_best")
    run = server["runs"][0]
    assert (run["answered"], run["retracted"], run["errors"]) == (393, 0, 0)
    assert max(o for _, o in run["requests_list"]) == 16384
    assert plan_memory(model, H200, flags, V0517).max_running_requests == 122
    sim = replay_requests(model, H200, flags, V0517, [tuple(r) for r in run["requests_list"]],
                          run["concurrency"], max_s=run["wall_s"])
    assert abs(sim.answered - run["answered"]) <= 5 and sim.retracted == 0
    assert sim.committed_tok_s == pytest.approx(run["committed_tok_s"], rel=0.15)


def test_lognormal_workloads_keep_their_mean_and_p99() -> None:
    lengths = sorted(Workload(1024, 2000, 16000).output_lengths(4000))
    assert sum(lengths) / len(lengths) == pytest.approx(2000, rel=0.05)
    assert lengths[int(0.99 * len(lengths))] == pytest.approx(16000, rel=0.05)
    assert Workload(8, 100).output_lengths(3) == [100, 100, 100]


def test_a_workload_is_refused_with_its_field_named() -> None:
    with pytest.raises(ValueError, match="p99"):
        Workload(1024, 2000, 1500)
    with pytest.raises(ValueError, match="at least 1"):
        Workload(0, 256)


def test_nemotron_h_runs_extra_buffer_as_sglang_0517_resolves_it() -> None:
    """0.5.17's own tables (overrides.py: `_MAMBA_EXTRA_BUFFER_ARCHS` lists
    NemotronHForCausalLM, the linear-attention backend is triton) make `auto` with the
    overlap schedule on extra_buffer, 5 slots a request; an explicit no_buffer turns overlap
    off; another linear-attention backend is refused in SGLang's words."""
    from infra.sglang.memory import PoolsDoNotFit

    model, flags, _ = setup("nh4b_nb")
    auto = plan_memory(model, H200, ServerFlags(), V0517)
    assert (auto.mamba_strategy, auto.overlap_schedule, auto.slot_ratio) == (
        "extra_buffer", True, 5)
    assert auto.max_running_requests == auto.mamba_slots // 5
    no_buffer = plan_memory(model, H200, flags, V0517)
    assert (no_buffer.mamba_strategy, no_buffer.overlap_schedule) == ("no_buffer", False)
    flashinfer = ServerFlags(mamba_strategy="extra_buffer",
                             extra_args=("--linear-attn-backend", "flashinfer"))
    with pytest.raises(PoolsDoNotFit, match="not supported for NemotronHForCausalLM"):
        plan_memory(model, H200, flashinfer, V0517)
