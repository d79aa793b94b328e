"""The memory model reproduces SGLang's accounting (reference §2–3)."""

from __future__ import annotations

import pytest

from infra.sglang.flags import ServerFlags
from infra.sglang.memory import PoolsDoNotFit, per_slot_bytes, plan_memory
from infra.sglang.profiles import gpu_profile, model_profile

QWEN = model_profile("Qwen/Qwen3.6-27B")
B200 = gpu_profile("b200")
RTX = gpu_profile("rtx-pro-6000")
MTP = {"speculative_algorithm": "EAGLE", "speculative_num_steps": 3,
       "speculative_eagle_topk": 1}


def test_seed_004_pools_and_cap_are_pinned() -> None:
    flags = ServerFlags(mamba_strategy="extra_buffer", max_mamba_cache_size=80, **MTP)
    plan = plan_memory(QWEN, B200, flags, "main")
    assert plan.mamba_slots == 80
    assert plan.ssm_state_gib == 11.39
    assert plan.intermediate_gib == 9.56
    assert plan.conv_state_gib == 0.22
    assert plan.max_running_requests == 16
    assert plan.slot_ratio == 5
    assert plan.binding_limit == "mamba"


def test_qwen36_per_slot_state_is_146_81_mib() -> None:
    conv, ssm = per_slot_bytes(QWEN, ServerFlags())
    assert conv + ssm == 153_944_064
    assert ssm == 48 * 3 * 2**20


def test_bf16_ssm_dtype_halves_the_ssm_part() -> None:
    conv, ssm = per_slot_bytes(QWEN, ServerFlags(mamba_ssm_dtype="bfloat16"))
    assert conv + ssm == 78_446_592


def test_qwen3_next_slot_is_73_69_mib_and_quarter_at_tp4() -> None:
    nxt = model_profile("qwen3-next-80b-a3b")
    assert sum(per_slot_bytes(nxt, ServerFlags())) == 77_266_944
    assert sum(per_slot_bytes(nxt, ServerFlags(tp_size=4))) == 77_266_944 // 4


def test_default_fraction_matches_sglang_heuristic() -> None:
    plan = plan_memory(QWEN, B200, ServerFlags(), "main")
    assert plan.mem_fraction_static == pytest.approx(0.793, abs=0.002)
    plan = plan_memory(QWEN, RTX, ServerFlags(), "main")
    assert plan.mem_fraction_static == pytest.approx(0.798, abs=0.002)


@pytest.mark.parametrize(("version", "slots"), [("main", 164), ("0.5.23", 161), ("0.5.11", 192)])
def test_speculative_reservation_differs_by_version(version: str, slots: int) -> None:
    plan = plan_memory(QWEN, B200, ServerFlags(mamba_strategy="extra_buffer", **MTP), version)
    assert plan.mamba_slots == slots


def test_no_buffer_fits_more_requests_than_extra_buffer() -> None:
    eb = plan_memory(QWEN, RTX, ServerFlags(mamba_strategy="extra_buffer"), "0.5.23")
    nb = plan_memory(QWEN, RTX, ServerFlags(mamba_strategy="no_buffer"), "0.5.23")
    assert eb.slot_ratio == 5 and nb.slot_ratio == 3
    assert nb.max_running_requests > eb.max_running_requests
    assert eb.binding_limit == nb.binding_limit == "mamba"


def test_auto_resolves_by_version() -> None:
    assert plan_memory(QWEN, RTX, ServerFlags(), "0.5.11").mamba_strategy == "no_buffer"
    assert plan_memory(QWEN, RTX, ServerFlags(), "0.5.23").mamba_strategy == "extra_buffer"


def test_requested_cap_binds_when_small() -> None:
    plan = plan_memory(QWEN, B200, ServerFlags(max_running_requests=4), "0.5.23")
    assert plan.max_running_requests == 4
    assert plan.binding_limit == "requested"


def test_dense_model_has_no_mamba_pool() -> None:
    dense = model_profile("qwen3-32b")
    plan = plan_memory(dense, gpu_profile("h100"), ServerFlags(), "0.5.23")
    assert plan.mamba_slots == 0 and plan.mamba_cap is None
    assert plan.binding_limit in ("kv", "requested")


def test_too_little_memory_is_refused_with_the_fix() -> None:
    with pytest.raises(PoolsDoNotFit, match="raise it to at least"):
        plan_memory(QWEN, RTX, ServerFlags(mem_fraction_static=0.5), "0.5.23")


def test_huge_slot_count_leaves_no_kv_and_is_refused() -> None:
    with pytest.raises(PoolsDoNotFit, match="KV cache"):
        plan_memory(QWEN, RTX, ServerFlags(max_mamba_cache_size=5000), "0.5.23")


def test_kv_tokens_follow_cell_size() -> None:
    plan = plan_memory(QWEN, RTX, ServerFlags(mamba_strategy="no_buffer"), "0.5.23")
    assert plan.kv_cell_bytes == 65536
    assert plan.max_total_num_tokens == pytest.approx(plan.kv_cache_gib * 2**30 / 65536,
                                                      rel=0.01)
