"""A MoE hybrid class no fit has seen, on real SGLang 0.5.17 on an H100: Granite-4.0-H-Tiny's
shapes (`GraniteMoeHybridForCausalLM`, Mamba2 + 64-expert MoE; dummy weights;
bench/real_sglang/data/2026-12-06-h100-s24). The planner's figures were written down before the
run (`plans/blind_granite_tiny_h100_b.predicted-h100.json`); this holds today's planner to
what the server did: no_buffer, bf16 SSM state, decode graphs raised to 320 and the overlap
schedule off, at its cap of 302.

What ran first (`gtb.log`): the same flags without `--disable-overlap-schedule` did not start —
0.5.17 asserts "no_buffer do not support overlap schedule" for an explicit no_buffer
(`srt/server_args.py::ServerArgs._validate_mamba_no_buffer`; only `auto` turns overlap off
itself, `srt/arg_groups/overrides.py::_mamba_radix_cache_resolution`). The pipeline's launcher
adds the flag (infra/sglang/launch.py); the device plan had passed raw flags."""

from __future__ import annotations

import io
import json
import sys
import tarfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from infra.sglang.launch import server_args
from infra.sglang.memory import plan_memory
from infra.sglang.profiles import gpu_profile, model_profile
from infra.sim.predict import Workload, committed_tok_s

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "real_sglang"))
from fit_moe import MODELS, V0517, server_flags, steady_wave_tok_s

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "bench" / "real_sglang" / "data" / "2026-12-06-h100-s24"
H100 = gpu_profile("h100")
TINY = model_profile(str(MODELS / "granite-4.0-h-tiny"), 12.93)  # bf16 bytes of the shapes
LOADED = replace(TINY, weights_gib=13.05)  # what its log says the load took: pools come after it


def ran() -> dict[str, Any]:
    with tarfile.open(DATA / "gtc.tar.gz") as tar:
        member = tar.extractfile("gtc/results.json")
        assert member is not None
        (rec,) = [r for r in json.load(io.TextIOWrapper(member)) if "runs" in r]
    return dict(rec)


def run_named(rec: dict[str, Any], name: str) -> dict[str, Any]:
    return dict(next(r for r in rec["runs"] if r["name"] == name))


def test_the_server_started_and_answered_everything_it_was_sent() -> None:
    rec = ran()
    assert rec["name"] == "gt_nb_bf16_g320_nov" and "--disable-overlap-schedule" in rec["flags"]
    wave = run_named(rec, "wave")
    assert wave["answered"] == wave["requests_sent"] == 604 and wave["errors"] == 0
    with tarfile.open(DATA / "gtb.tar.gz") as tar:
        logs = [tar.extractfile(m) for m in tar.getmembers() if m.name.endswith(".log")]
        said = [f.read().decode() for f in logs if f is not None]
    assert len(said) == 2 and all(
        "AssertionError: no_buffer do not support overlap schedule" in text for text in said)


def test_the_launcher_turns_the_overlap_schedule_off_for_an_explicit_no_buffer() -> None:
    flags = server_flags(["--mamba-radix-cache-strategy", "no_buffer"])
    argv = server_args(flags, V0517, model="m", host="127.0.0.1", port=30000, api_key=None)
    assert "--disable-overlap-schedule" in argv


def test_pools_on_a_class_no_fit_saw_are_within_one_percent() -> None:
    rec = ran()
    plan = plan_memory(LOADED, H100, server_flags(rec["flags"]), V0517)
    assert (plan.mamba_strategy, plan.slot_ratio) == ("no_buffer", 3)
    assert plan.max_total_num_tokens == pytest.approx(rec["max_total_num_tokens"], rel=0.01)
    assert plan.mamba_slots == pytest.approx(rec["max_mamba_cache_size"], rel=0.01)


@pytest.mark.xfail(strict=True, reason="open: the plan gives 909 mamba slots (cap 303) where "
                   "the server allocated 908 (cap 302): within a slot, but a third of a "
                   "request's 3 slots over the cap's boundary")
def test_the_cap_is_exact() -> None:
    rec = ran()
    plan = plan_memory(LOADED, H100, server_flags(rec["flags"]), V0517)
    assert plan.max_running_requests == rec["max_running_requests"]


def test_the_wave_at_the_cap_is_planned_within_15_percent() -> None:
    """Planned against 5,785 steady (the answers sent after the first came back; 5,144 over
    the whole 30 s, first wave's prefill included). Long mixed outputs, and the H100's step
    fit on this and four more configurations: test_real_granite_h100.py."""
    rec = ran()
    predicted = committed_tok_s(TINY, H100, server_flags(rec["flags"]), V0517,
                                Workload(1024, 256))
    assert predicted == pytest.approx(steady_wave_tok_s(run_named(rec, "wave")), rel=0.15)


def test_plan_names_the_flag_a_launch_line_of_ones_own_needs() -> None:
    """What killed gtb's servers, said by `expansion plan` before a user's own launch does."""
    from infra.sglang.strategy import launch_needs

    bare = server_flags(["--mamba-radix-cache-strategy", "no_buffer"])
    (need,) = launch_needs(TINY, bare, V0517)
    assert need.startswith("--disable-overlap-schedule") and "GraniteMoeHybrid" in need
    ran_with = server_flags(ran()["flags"])
    assert launch_needs(TINY, ran_with, V0517) == []
    qwen = model_profile(str(ROOT / "tests" / "fixtures" / "models" / "qwen3.6-27b-text"), 50.16)
    assert launch_needs(qwen, bare, V0517) == []  # not in 0.5.17's radix-cache table: it ran
