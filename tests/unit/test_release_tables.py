"""The mamba-cache tables come from SGLang's own source, per release, and resolve strategies
as that release does (infra/sglang/release_tables.py, strategy.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infra.sglang.flags import ServerFlags
from infra.sglang.memory import PoolsDoNotFit, plan_memory
from infra.sglang.profiles import gpu_profile, model_profile
from infra.sglang.release_tables import TABLES_FILE, extract, read_overrides, write_tables
from infra.sglang.versions import parse_version

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ROOT / "tests" / "fixtures" / "sglang-source"
Q35 = ROOT / "bench" / "real_sglang" / "models" / "qwen3.6-35b-a3b-text"
H200 = gpu_profile("h200")


def test_the_committed_tables_are_what_the_releases_source_says() -> None:
    sources = [(p.name.split("-")[1].removesuffix(".py.gz"), p)
               for p in sorted(SOURCES.glob("overrides-*.py.gz"))]
    assert [r for r, _ in sources] == ["0.5.15", "0.5.17", "0.5.23"]
    assert write_tables(sources) == json.loads(TABLES_FILE.read_text())


def test_a_release_whose_resolution_moved_is_refused_not_guessed() -> None:
    text = read_overrides(SOURCES / "overrides-0.5.17.py.gz")
    with pytest.raises(ValueError, match="_MAMBA_EXTRA_BUFFER_ARCHS"):
        extract(text.replace("_MAMBA_EXTRA_BUFFER_ARCHS = frozenset(", "_RENAMED = frozenset("),
                "0.5.17")


def test_the_35b_a3b_text_model_runs_no_buffer_by_default_on_0517_and_extra_buffer_on_0523(
) -> None:
    """0.5.17: Qwen3_5MoeForCausalLM is in neither table, so `auto` stays auto (no_buffer's 3
    slots, overlap kept on): real SGLang ran 480 slots, cap 160. 0.5.23 lists it in both."""
    model = model_profile(str(Q35), 64.63)
    old = plan_memory(model, H200, ServerFlags(), parse_version("0.5.17"))
    assert (old.mamba_strategy, old.overlap_schedule, old.slot_ratio) == ("no_buffer", True, 3)
    assert (old.mamba_slots, old.max_running_requests) == (480, 160)
    new = plan_memory(model, H200, ServerFlags(), parse_version("0.5.23"))
    assert (new.mamba_strategy, new.slot_ratio) == ("extra_buffer", 5)


def test_explicit_extra_buffer_is_checked_only_where_the_release_checks_it() -> None:
    """0.5.17 takes extra_buffer unchecked for an architecture outside the radix-cache table
    (the 35B text model ran it: cap 96), and asserts on one inside it that lacks support."""
    model = model_profile(str(Q35), 64.63)
    plan = plan_memory(model, H200, ServerFlags(mamba_strategy="extra_buffer"),
                       parse_version("0.5.17"))
    assert (plan.mamba_strategy, plan.max_running_requests) == ("extra_buffer", 96)
    lfm2 = model_profile(str(ROOT / "bench" / "real_sglang" / "models" / "lfm2-1.2b"), 2.2)
    with pytest.raises(PoolsDoNotFit, match="extra_buffer is not supported for Lfm2ForCausalLM"):
        plan_memory(lfm2, H200, ServerFlags(mamba_strategy="extra_buffer"),
                    parse_version("0.5.17"))


def test_which_architectures_default_to_the_cutlass_moe_runner_is_read_per_release() -> None:
    """0.5.17's `_nemotron_h_overrides` (registered for both NemotronH architectures) gives an
    unquantized checkpoint flashinfer_cutlass before SM100; 0.5.23 dropped that branch."""
    def archs(release: str) -> frozenset[str]:
        return extract(read_overrides(SOURCES / f"overrides-{release}.py.gz"),
                       release).cutlass_moe_archs

    assert archs("0.5.17") == {"NemotronHForCausalLM", "NemotronHPuzzleForCausalLM"}
    assert archs("0.5.23") == frozenset()
