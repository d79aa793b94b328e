"""Which routers add a per-expert bias, as the release's model files build them
(infra/sglang/router_tables.py), and what that prior does to a family no run measured."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from infra.sglang.profiles import model_profile
from infra.sglang.roofline import dummy_spread_prior
from infra.sglang.router_tables import (
    TABLES_FILE,
    biased_router,
    extract,
    hybrid_archs,
    model_sources,
    router_bias,
)

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ROOT / "tests" / "fixtures" / "sglang-source" / "models-0.5.17"
MODELS = ROOT / "bench" / "real_sglang" / "models"


def test_the_committed_table_is_what_the_releases_model_files_say() -> None:
    read = extract(model_sources(SOURCES), hybrid_archs("0.5.17"))
    assert read == json.loads(TABLES_FILE.read_text())["0.5.17"]["archs"]


def test_nemotron_h_and_kimi_always_bias_lfm2_on_its_config_and_bailing_is_not_followed() -> None:
    """nemotron_h.py and kimi_linear.py create `gate.e_score_correction_bias` as a parameter
    and pass it; lfm2_moe.py passes `expert_bias if config.use_expert_bias else None`;
    bailing_moe_linear.py's bias depends on its gate, which this reading does not follow.
    Granite's and Qwen3.5's files build no TopK (their spreads are measured)."""
    table = json.loads(TABLES_FILE.read_text())["0.5.17"]["archs"]
    assert table["NemotronHForCausalLM"] == table["KimiLinearForCausalLM"] == "always"
    assert table["Lfm2MoeForCausalLM"] == "config:use_expert_bias"
    assert table["BailingMoeV2_5ForCausalLM"] == "conditional"
    assert "GraniteMoeHybridForCausalLM" not in table
    assert "Qwen3_5MoeForConditionalGeneration" not in table


@pytest.mark.parametrize(("source", "bias"), [
    ("t = TopK(top_k=4, correction_bias=None)", "never"),
    ("t = TopK(top_k=4)", "never"),
    ("t = TopK(correction_bias=b if config.use_bias else None)", "config:use_bias"),
    ("self.g.bias = nn.Parameter(x)\nt = TopK(correction_bias=self.g.bias)", "always"),
    ("self.b = g.bias if g.bias is not None else None\nt = TopK(correction_bias=self.b)",
     "conditional"),
    ("x = 1", None),
])
def test_a_topk_calls_bias_is_read_from_what_it_is_given(source: str, bias: str | None,
                                                         ) -> None:
    assert router_bias(source) == bias


def test_lfm2_moe_biases_where_its_config_says_so() -> None:
    assert biased_router("Lfm2MoeForCausalLM", {"use_expert_bias": True}) is True
    assert biased_router("Lfm2MoeForCausalLM", {"use_expert_bias": False}) is False
    assert biased_router("Lfm2MoeForCausalLM", {}) is False
    assert biased_router("BailingMoeV2_5ForCausalLM", {}) is None
    assert biased_router("Qwen3_5MoeForCausalLM", {}) is None


def test_a_biased_router_is_priced_on_its_top_k_experts_and_an_unbiased_one_on_all() -> None:
    """Nemotron-30B: 6 of 128 (its H100 spread, measured since, is the fit's lowest: 0.02,
    which prices the same top-k); LFM2-8B-A1B: 4 of 32; Qwen3.6-35B-A3B: all of them."""
    nemotron = model_profile(str(MODELS / "nemotron-3-nano-30b-a3b"), 58.82)
    lfm2_moe = model_profile(str(MODELS / "lfm2-8b-a1b"), 15.53)
    qwen = model_profile(str(MODELS / "qwen3.6-35b-a3b-text"), 64.63)
    assert dummy_spread_prior(nemotron) == pytest.approx(6 / 128)
    assert dummy_spread_prior(lfm2_moe) == pytest.approx(4 / 32)
    assert dummy_spread_prior(qwen) == 1.0
    assert nemotron.moe is not None
    unbiased = replace(nemotron, moe=replace(nemotron.moe, biased_router=False))
    assert dummy_spread_prior(unbiased) == 1.0


def test_nemotron_30bs_h100_waves_under_a_borrowed_entry_are_right_only_with_the_prior(
        ) -> None:
    """What a never-met biased-router family gets, tried on one that has been met: the four
    Nemotron-30B H100 waves priced with the H200's entry (the fallback of a family with no
    fit on a Hopper GPU) are 8-16 % low with the prior, 39-63 % low as a trained router
    (the blind record's miss); the Granite runs, whose router has no bias, are unchanged."""
    sys.path.insert(0, str(ROOT / "bench" / "real_sglang"))
    import borrowed_entries as borrowed

    with_prior, trained = borrowed.errors("H200"), borrowed.errors("H200", trained_spread=True)
    nemotron = [name for name in with_prior if name.startswith("nh")]
    assert len(nemotron) == 4
    assert all(abs(with_prior[name]) <= 0.20 for name in nemotron)
    assert all(trained[name] <= -0.35 for name in nemotron)
    assert all(with_prior[n] == trained[n] for n in with_prior if not n.startswith("nh"))
