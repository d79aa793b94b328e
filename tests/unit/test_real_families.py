"""Every hybrid family SGLang 0.5.17 serves, planned as it allocates on the H200, two
configurations each (bench/real_sglang/data/2026-12-02-h200-s9/pools/ and -s10/pools/, from
`device.sh pools`: probe_pools.py started each server with dummy weights and the family's public
shapes from bench/real_sglang/models/, read its pools from the start-up log and its cap from
/server_info).

In session 9 Granite and LFM2 crashed after allocating their pools (the triton attention backend
cannot start Granite's first, mamba, layer; this runtime's sgl_kernel has no FA3 for LFM2's);
session 10 started both with flashinfer, and its records replace session 9's."""

from __future__ import annotations

import gzip
import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from infra.sglang.flag_parser import parse_server_flags
from infra.sglang.memory import plan_memory
from infra.sglang.profiles import gpu_profile, model_profile
from infra.sglang.versions import parse_version

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "bench" / "real_sglang" / "data" / "2026-12-02-h200-s9" / "pools"
DATA_S10 = ROOT / "bench" / "real_sglang" / "data" / "2026-12-02-h200-s10" / "pools"
MODELS = ROOT / "bench" / "real_sglang" / "models"
H200 = gpu_profile("h200")
V0517 = parse_version("0.5.17")


@cache
def probes() -> dict[str, dict[str, Any]]:
    """model/default and model/changed → the probe's record (its folder under "dir"); a later
    session's record of the same key replaces the earlier one."""
    return {r["model"] + "/" + ("default" if "default" in r["name"] else "changed"): r | {"dir": d}
            for d in (DATA, DATA_S10) for r in json.loads((d / "results.json").read_text())}


def logged(record: dict[str, Any], pattern: str) -> str:
    text = gzip.decompress((record["dir"] / f"{record['name']}.log.gz").read_bytes()).decode()
    match = re.search(pattern, text)
    assert match, pattern
    return match.group(1)


def plan_for(key: str) -> tuple[Any, dict[str, Any]]:
    record = probes()[key]
    argv = list(record["flags"])
    while "--attention-backend" in argv:  # a kernel choice, not a pool
        at = argv.index("--attention-backend")
        del argv[at:at + 2]
    weights = float(logged(record, r"Load weight end\..*?mem usage=([\d.]+) GB"))
    model = model_profile(str(MODELS / record["model"]), weights)
    return plan_memory(model, H200, parse_server_flags(argv), V0517), record


FAMILIES = ["falcon-h1-0.5b", "granite-4.0-h-1b", "kimi-linear-48b-a3b", "lfm2-1.2b"]
CASES = [f"{family}/{config}" for family in FAMILIES for config in ("default", "changed")]


def test_every_family_ran_two_configurations_to_a_cap() -> None:
    assert sorted(probes()) == sorted(CASES)
    assert all(probes()[key]["outcome"] == "ok" for key in CASES)


@pytest.mark.parametrize("key", CASES)
def test_the_plan_gives_the_pools_real_sglang_allocated(key: str) -> None:
    plan, real = plan_for(key)
    assert plan.max_total_num_tokens == pytest.approx(int(logged(real, r"#tokens: (\d+)")),
                                                      rel=0.01)
    slots = int(logged(real, r"max_mamba_cache_size: (\d+)"))
    # An LFM2 slot is 80 KiB, and the log gives the weights to 0.01 GB: ±64 slots of slack
    assert abs(plan.mamba_slots - slots) <= (64 if key.startswith("lfm2") else 1)
    assert plan.ssm_state_gib == pytest.approx(float(logged(real, r"ssm_state size: ([\d.]+)GB")),
                                               abs=0.05)
    assert plan.mem_fraction_static == float(logged(real, r"mem_fraction_static=([\d.]+)"))
    strategy = logged(real, r"mamba_radix_cache_strategy='(\w+)'")
    assert plan.mamba_strategy == strategy


def _lfm2_plan(weights_gib: float, key: str) -> Any:
    argv = [f for f in probes()[key]["flags"] if f not in ("--attention-backend", "flashinfer")]
    return plan_memory(model_profile(str(MODELS / "lfm2-1.2b"), weights_gib), H200,
                       parse_server_flags(argv), V0517)


def test_lfm2s_slack_is_the_logs_rounding_of_the_weights_not_the_model() -> None:
    """The ±64 above is what 0.01 GB of weights is in 80-KiB slots. Solve the one unknown —
    the weight bytes the log rounds — from the default configuration's slot count, then the
    other configuration (`--mamba-full-memory-ratio 0.3`) must come out to ±1 slot and its KV
    pool within 16 tokens: the memory model is exact for LFM2 too. The solved figure (2.500
    GiB) is 10 MiB above the log's "mem usage=2.49 GB", the order of the two-decimal figures
    the weights and the free memory are known to (the other families' slots are MBs each,
    so 10 MiB is under one of theirs)."""
    slots = {k: int(logged(probes()[k], r"max_mamba_cache_size: (\d+)"))
             for k in ("lfm2-1.2b/default", "lfm2-1.2b/changed")}
    lo, hi = 2.47, 2.52  # more weights, fewer slots
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _lfm2_plan(mid, "lfm2-1.2b/default").mamba_slots > slots[
            "lfm2-1.2b/default"] else (lo, mid)
    assert _lfm2_plan(hi, "lfm2-1.2b/default").mamba_slots == slots["lfm2-1.2b/default"]
    assert abs(hi - 2.49) <= 0.015
    other = _lfm2_plan(hi, "lfm2-1.2b/changed")
    assert abs(other.mamba_slots - slots["lfm2-1.2b/changed"]) <= 1
    real_kv = int(logged(probes()["lfm2-1.2b/changed"], r"#tokens: (\d+)"))
    assert abs(other.max_total_num_tokens - real_kv) <= 16


@pytest.mark.parametrize("key", CASES)
def test_the_cap_is_the_one_real_sglang_resolved(key: str) -> None:
    """The state pool binds every family but LFM2, whose conv state is 80 KiB a request: its
    cap is the 4,096 SGLang starts from."""
    plan, real = plan_for(key)
    assert plan.max_running_requests == real["max_running_requests"]
    assert plan.binding_limit == ("requested" if key.startswith("lfm2") else "mamba")


def test_each_family_reads_its_own_state_layers() -> None:
    """Falcon-H1: mamba and attention in all 36 layers; Granite: 36 mamba of 40; LFM2: 10
    conv layers and no SSM state; Kimi-Linear: 20 KDA layers of 27, MLA on the other 7."""
    shapes = {name: model_profile(str(MODELS / name), 1.0) for name in
              ("falcon-h1-0.5b", "granite-4.0-h-1b", "lfm2-1.2b", "kimi-linear-48b-a3b")}
    got = {k: (m.num_linear_layers, m.num_full_layers, m.family) for k, m in shapes.items()}
    assert got == {"falcon-h1-0.5b": (36, 36, "mamba2"), "granite-4.0-h-1b": (36, 4, "mamba2"),
                   "lfm2-1.2b": (10, 6, "conv"), "kimi-linear-48b-a3b": (20, 7, "gdn")}
    lfm2 = shapes["lfm2-1.2b"].mamba
    assert lfm2 is not None and lfm2.state_size == 0
    assert shapes["kimi-linear-48b-a3b"].mla_kv_dim == 512 + 64


def test_nemotron_3_block_lists_and_sglang_spellings_plan_like_the_pattern(
        tmp_path: Path) -> None:
    """Nemotron 3 lists its layers as words, and need not say how many: NemotronHConfig
    takes the count from the list (`num_hidden_layers` is a property of it in
    srt/configs/nemotron_h.py); SGLang's config calls n_groups and conv_kernel mamba_n_groups
    and mamba_d_conv. All read to the plan of the pattern form."""
    cfg = json.loads((MODELS / "nemotron-3-nano-4b" / "config.json").read_text())
    words = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
    listed = {k: v for k, v in cfg.items() if k not in ("hybrid_override_pattern", "n_groups",
                                                       "conv_kernel", "num_hidden_layers")}
    listed |= {"layers_block_type": [words[c] for c in cfg["hybrid_override_pattern"]],
               "mamba_n_groups": cfg["n_groups"], "mamba_d_conv": cfg["conv_kernel"]}
    (tmp_path / "config.json").write_text(json.dumps(listed))
    flags = parse_server_flags(["--mem-fraction-static", "0.9"])
    want = plan_memory(model_profile(str(MODELS / "nemotron-3-nano-4b"), 7.47), H200, flags,
                       V0517)
    got = plan_memory(model_profile(str(tmp_path), 7.47), H200, flags, V0517)
    assert (got.mamba_slots, got.max_running_requests, got.max_total_num_tokens) == (
        want.mamba_slots, want.max_running_requests, want.max_total_num_tokens)


def test_nemotron_h_layer_list_wins_over_the_pattern_and_the_stated_count(
        tmp_path: Path) -> None:
    """With both forms, NemotronHConfig keeps `layers_block_type` and ignores a
    `num_hidden_layers` that disagrees (it logs a warning); a word it does not take is refused
    naming the field."""
    cfg = json.loads((MODELS / "nemotron-3-nano-4b" / "config.json").read_text())
    pattern = cfg["hybrid_override_pattern"]
    words = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
    both = cfg | {"layers_block_type": [words[c] for c in pattern[:8]],
                  "hybrid_override_pattern": pattern, "num_hidden_layers": 99}
    (tmp_path / "config.json").write_text(json.dumps(both))
    profile = model_profile(str(tmp_path), 7.47)
    assert profile.num_layers == 8 and profile.num_linear_layers == pattern[:8].count("M")
    (tmp_path / "config.json").write_text(json.dumps(cfg | {"layers_block_type": ["ssm"]}))
    with pytest.raises(ValueError, match=r"layers_block_type holds 'ssm'"):
        model_profile(str(tmp_path), 7.47)


def test_a_hybrid_the_planner_cannot_read_is_refused_never_planned_dense(
        tmp_path: Path) -> None:
    cfg = {"architectures": ["JambaForCausalLM"], "num_hidden_layers": 32, "hidden_size": 4096,
           "num_attention_heads": 32, "num_key_value_heads": 8, "mamba_d_state": 16}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"JambaForCausalLM has state layers \(field "
                                         r"mamba_d_state\).*wrong cap"):
        model_profile(str(tmp_path), 10.0)


def test_a_hybrid_sglang_lists_is_refused_even_when_its_config_names_no_state_field(
        tmp_path: Path) -> None:
    """BailingMoeV2_5's linear attention states its layers in fields the planner does not
    know; SGLang's own tables list the architecture as a mamba-cache hybrid, so it is refused,
    not planned as a dense model with every layer caching KV."""
    cfg = {"architectures": ["BailingMoeV2_5ForCausalLM"], "num_hidden_layers": 20,
           "hidden_size": 2048, "num_attention_heads": 16, "num_key_value_heads": 4}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"^model: .*config.json: BailingMoeV2_5ForCausalLM "
                                         r"has state layers \(SGLang's own mamba cache tables"):
        model_profile(str(tmp_path), 30.0)


@pytest.mark.parametrize(("model", "refused"), [("lfm2-1.2b", True), ("granite-4.0-h-1b", True),
                                                ("nemotron-3-nano-4b", True),
                                                ("falcon-h1-0.5b", False)])
def test_triton_attention_is_refused_for_hybrids_that_start_with_a_state_layer(
        model: str, refused: bool) -> None:
    """Real 0.5.17 refuses triton for NemotronH and LFM2 and dies with it on Granite-4.0-H
    (its first layer is mamba); Falcon-H1 ran on it (session 9)."""
    from infra.settings import JobSettings
    from tasks.engines.sglang_family import check_attention_backend

    settings = JobSettings(model=str(MODELS / model), weights_gib=2.0, engine="sglang",
                           sglang_version="0.5.17",
                           server={"extra_args": ["--attention-backend", "triton"]})
    if refused:
        with pytest.raises(ValueError, match=r"server\.extra_args: --attention-backend triton "
                                             r"cannot run .*use flashinfer"):
            check_attention_backend(settings)
    else:
        check_attention_backend(settings)
    check_attention_backend(settings.model_copy(update={"server": settings.server.with_changes(
        extra_args=["--attention-backend", "flashinfer"])}))
