"""Every move's ratio on the two MoE hybrids (#38): for each configuration real SGLang 0.5.17
served beside its family's defaults (H200, dummy weights; waves of 1,024-token prompts and
256-token answers at the cap, sessions 16, 18 and 19), the planner's gain over the defaults
against the measured one, within 10 %. A gain is what the tuner acts on: a rate that is off
by the same factor everywhere does not move it, a ratio that is off does."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from infra.sglang.profiles import model_profile
from infra.sim.predict import Workload, committed_tok_s

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "real_sglang"))
from fit_moe import (
    DATA,
    H200,
    HELD_OUT,
    KIMI_S19,
    MODELS,
    V0517,
    WEIGHTS_GIB,
    records,
    server_flags,
    steady_wave_tok_s,
)

DEFAULTS = {"qwen3.6-35b-a3b-text": "q35_default", "kimi-linear-48b-a3b": "kimi_default"}
SERVED = {r["name"]: r for folder in (DATA, HELD_OUT, KIMI_S19) for r in records(folder)
          if r["model"] in DEFAULTS and "error" not in r}
RATIO_OFF = {  # name → why its gain misses 10 % (a strict xfail: it turns red when fixed)
    "q35_nb_bf16": "open: cap 313 with the default decode graphs (256) ran eager at 0.72x the "
                   "default where the plan says 0.82x (+14 %): the eager step is priced low",
    "kimi_nb_bf16_g320": "open: Kimi at 320 running measured 1.35x its default where the plan "
                         "says 1.21x (-10.4 %): its step at 320 is faster than the MLA term "
                         "fitted on every Kimi level (test_real_moe.py's strict xfail)",
}


def wave_and_plan(rec: dict[str, Any]) -> tuple[float, float]:
    model = model_profile(str(MODELS / rec["model"]), WEIGHTS_GIB[rec["model"]])
    wave = next(r for r in rec["runs"] if r["name"] == "wave")
    planned = committed_tok_s(model, H200, server_flags(rec["flags"]), V0517,
                              Workload(1024, 256))
    return steady_wave_tok_s(wave), planned


MOVES = sorted(n for n in SERVED if n not in DEFAULTS.values())


def test_both_families_have_four_moves_or_more() -> None:
    by_family = {m: [n for n in MOVES if SERVED[n]["model"] == m] for m in DEFAULTS}
    assert all(len(names) >= 3 for names in by_family.values()), by_family
    assert len(MOVES) == 8


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.xfail(reason=RATIO_OFF[n], strict=True))
    if n in RATIO_OFF else n for n in MOVES])
def test_every_moves_gain_is_planned_within_10_percent(name: str) -> None:
    rec = SERVED[name]
    measured, planned = wave_and_plan(rec)
    base_measured, base_planned = wave_and_plan(SERVED[DEFAULTS[rec["model"]]])
    assert planned / base_planned == pytest.approx(measured / base_measured, rel=0.10)
