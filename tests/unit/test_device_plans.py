"""The device plans (bench/real_sglang/plans/*.json) start on the release they target. They
hand their flags to `sglang.launch_server` as written — not through the pipeline's launcher,
which adds what a release demands — so a plan that leaves out a flag SGLang asserts on costs a
device call (a Granite no_buffer plan without `--disable-overlap-schedule` died at start-up:
bench/real_sglang/data/2026-12-06-h100-s24/gtb.tar.gz)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infra.sglang.calibration_note import default_moe_runner
from infra.sglang.flag_parser import parse_server_flags
from infra.sglang.profiles import gpu_profile, model_profile
from infra.sglang.strategy import uses_radix_cache
from infra.sglang.versions import parse_version

PLANS = Path(__file__).resolve().parents[2] / "bench" / "real_sglang" / "plans"
MODELS = PLANS.parent / "models"
RUNTIME_MODELS = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "models"
V0517 = parse_version("0.5.17")


def servers() -> list[tuple[str, dict]]:
    return [(f"{p.name}:{s['name']}", s) for p in sorted(PLANS.glob("*.json"))
            if ".predicted" not in p.name for s in json.loads(p.read_text())]


def config_of(model: str) -> Path | None:
    for root in (MODELS, RUNTIME_MODELS):
        if (root / model / "config.json").is_file():
            return root / model
    return None


@pytest.mark.parametrize(("where", "server"), servers(), ids=[w for w, _ in servers()])
def test_an_explicit_no_buffer_disables_the_overlap_schedule(where: str, server: dict) -> None:
    """0.5.17 `ServerArgs._validate_mamba_no_buffer` (srt/server_args.py) asserts the overlap
    schedule is off for an explicit no_buffer on every architecture that uses the mamba radix
    cache; only `auto` turns it off itself (`_mamba_radix_cache_resolution`)."""
    flags = server["flags"]
    if "no_buffer" not in flags:
        return
    folder = config_of(server["model"])
    if folder is None:
        pytest.skip(f"{server['model']}: its config is only in the device runtime")
    if uses_radix_cache(model_profile(str(folder), 1.0), V0517):  # weights: no matter
        assert "--disable-overlap-schedule" in flags, where


@pytest.mark.parametrize(("where", "server"), servers(), ids=[w for w, _ in servers()])
def test_no_plan_leaves_its_experts_to_a_runner_no_fit_measured(where: str, server: dict) -> None:
    """A NemotronH MoE with no `--moe-runner-backend` runs flashinfer_cutlass on 0.5.17
    (`_nemotron_h_overrides`, srt/arg_groups/overrides.py): the device's first such server was
    still autotuning 480 s after its weights loaded (data/2026-12-07-h100-s34/nhw.tar.gz)."""
    folder = config_of(server["model"])
    if folder is None:
        pytest.skip(f"{server['model']}: its config is only in the device runtime")
    flags = parse_server_flags([f for f in server["flags"] if f != "--skip-tokenizer-init"],
                               V0517)
    for gpu in ("h100", "h200"):
        assert not default_moe_runner(gpu_profile(gpu), model_profile(str(folder), 1.0), flags,
                                      V0517), where
