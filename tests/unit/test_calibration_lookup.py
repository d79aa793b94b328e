"""Which measured step constants a model is priced with (infra/sglang/roofline.py:
calibration_key): its kind on its GPU, then on a GPU of the same generation, then an MoE's
dense family fit, then the GPU's own entry — and what `expansion plan` says about each."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from infra.sglang import calibration_note as note_module
from infra.sglang.calibration_note import calibration_note
from infra.sglang.flag_parser import parse_server_flags
from infra.sglang.profiles import ModelProfile, gpu_profile, model_profile
from infra.sglang.roofline import calibration_key
from infra.sglang.versions import parse_version

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "bench" / "real_sglang" / "models"
Q27 = model_profile(str(ROOT / "tests" / "fixtures" / "models" / "qwen3.6-27b-text"), 50.16)
Q35 = model_profile(str(MODELS / "qwen3.6-35b-a3b-text"), 64.63)
GRANITE_SMALL = model_profile(str(MODELS / "granite-4.0-h-small"), 59.98)
NEMOTRON_4B = model_profile(str(MODELS / "nemotron-3-nano-4b"), 7.5)
LFM2 = model_profile(str(MODELS / "lfm2-1.2b"), 2.2)


@pytest.mark.parametrize(("model", "gpu", "key", "calibrated"), [
    (Q27, "h200", "H200", True),  # GDN's fit is the H200's own entry (the 27B)
    (Q27, "h100", "H200", False),  # no H100 GDN fit: the H200's, same generation
    (Q35, "h200", "H200/gdn-moe", True),
    (Q35, "h100", "H200/gdn-moe", False),
    (GRANITE_SMALL, "h100", "H100 80GB/mamba2-moe", True),
    # its kind's fit on a sibling GPU before its family's dense fit on its own
    (GRANITE_SMALL, "h200", "H100 80GB/mamba2-moe", False),
    (NEMOTRON_4B, "h200", "H200/mamba2", True),
    (NEMOTRON_4B, "h100", "H200/mamba2", False),
    (LFM2, "h200", "H200", False),  # no conv fit anywhere: the GPU's own entry
    (LFM2, "h100", "H200", False),  # ... and on the H100, its generation's own entry
    (Q27, "rtx-pro-6000", None, False),  # another generation's fit is never borrowed
], ids=lambda v: getattr(v, "architecture", v))
def test_the_entry_a_model_is_priced_with(model: ModelProfile, gpu: str, key: str | None,
                                          calibrated: bool) -> None:
    assert calibration_key(gpu_profile(gpu), model) == key
    note = calibration_note(gpu_profile(gpu), model)
    assert note.calibrated is calibrated


def test_a_borrowed_entry_is_named_as_such_with_the_uncalibrated_bound() -> None:
    said = calibration_note(gpu_profile("h100"), Q27).describe()
    assert said == ("step model not measured for this family on this GPU (nearest: H200, a GPU "
                    "of its generation); expect ±50% until a run measures it")
    own = calibration_note(gpu_profile("h200"), LFM2).describe()
    assert "a GPU of its generation" not in own


def test_a_model_far_from_every_size_its_entry_saw_is_called_extrapolated() -> None:
    """The 35B-A3B's entry saw 3.5 B active parameters; a GDN MoE of 17 B (Qwen3.5-397B-A17B's
    class) takes its constants but is told how far it is from them."""
    note = calibration_note(gpu_profile("h200"), replace(Q35, active_params_b=17.0))
    assert (note.calibrated, note.extrapolated, note.uncertainty) == (True, True, 0.25)
    assert note.describe() == ("step model measured as H200/gdn-moe on models of 3.49-3.54 B "
                               "active parameters, not this one's 17 B; expect ±25%")
    near = calibration_note(gpu_profile("h200"), Q35)
    assert (near.calibrated, near.extrapolated, near.uncertainty) == (True, False, 0.15)


def test_granite_small_against_a_tiny_only_fit_is_extrapolated(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """What the blind record should have said: the H100 entry fitted on Tiny alone (1.47 B)
    priced Small (8.8 B) 10-24 % high (test_real_granite_small_h100.py); since the fit took
    Small's waves, Small is inside its sizes."""
    assert not calibration_note(gpu_profile("h100"), GRANITE_SMALL).extrapolated
    monkeypatch.setattr(note_module, "fitted_sizes",
                        lambda: {"H100 80GB/mamba2-moe": (1.47, 1.47)})
    note = calibration_note(gpu_profile("h100"), GRANITE_SMALL)
    assert note.extrapolated and note.uncertainty == 0.25


NEMOTRON_30B = model_profile(str(MODELS / "nemotron-3-nano-30b-a3b"), 58.82)
DUMMY = ("--load-format", "dummy")
V0517 = parse_version("0.5.17")


def test_an_moe_whose_dummy_router_no_run_measured_is_unsure_under_dummy_weights() -> None:
    """Nemotron-30B's blind H100 plan ran 38-66 % under the server: its random router sends a
    batch to few experts, which nothing measured then. Since its fit, NemotronH's spread is
    measured; the same shapes under an architecture no run measured (SGLang serves
    NemotronHPuzzleForCausalLM with the same model class) are ±50 % under dummy weights, and
    as calibrated as NemotronH with real ones."""
    h100 = gpu_profile("h100")
    dummy, real = parse_server_flags(list(DUMMY), V0517), parse_server_flags([], V0517)
    measured = calibration_note(h100, NEMOTRON_30B, dummy)
    assert not measured.dummy_routing_unmeasured and measured.uncertainty == 0.15
    puzzle = replace(NEMOTRON_30B, architecture="NemotronHPuzzleForCausalLM")
    unmeasured = calibration_note(h100, puzzle, dummy)
    assert unmeasured.dummy_routing_unmeasured and unmeasured.uncertainty == 0.5
    assert unmeasured.describe() == (
        "step model measured as H100 80GB/mamba2-moe; the random-weight router's spread over "
        "NemotronHPuzzleForCausalLM's experts was never measured (it adds a per-expert bias, "
        "so every token is priced on the same top-k experts, as Kimi-Linear's and NemotronH's "
        "ran), expect ±50%")
    with_real = calibration_note(h100, puzzle, real)
    assert not with_real.dummy_routing_unmeasured and with_real.uncertainty == 0.15


def test_a_nemotron_moe_left_to_sglangs_default_runner_is_unmeasured_on_0517() -> None:
    """With no --moe-runner-backend, 0.5.17 runs an unquantized NemotronH's experts on
    flashinfer_cutlass on Hopper (the device's first such server was still autotuning 480 s
    after loading); every fit ran triton. Named triton, on 0.5.23, quantized, or another
    architecture, the plan is as sure as its fit."""
    h100, v0523 = gpu_profile("h100"), parse_version("0.5.23")
    default = parse_server_flags([], V0517)
    note = calibration_note(h100, NEMOTRON_30B, default, V0517)
    assert note.unmeasured_moe_runner == "flashinfer_cutlass" and note.uncertainty == 0.5
    assert "runs its experts on flashinfer_cutlass here" in note.describe()
    assert note.describe().endswith("expect ±50%")
    triton = parse_server_flags(["--moe-runner-backend", "triton"], V0517)
    for sure in (calibration_note(h100, NEMOTRON_30B, triton, V0517),
                 calibration_note(h100, NEMOTRON_30B, default, v0523),
                 calibration_note(h100, replace(NEMOTRON_30B, quantized=True), default, V0517),
                 calibration_note(h100, GRANITE_SMALL, default, V0517)):
        assert not sure.unmeasured_moe_runner and sure.uncertainty == 0.15


def test_a_config_with_a_quantization_config_reads_as_quantized(tmp_path: Path) -> None:
    """SGLang's override branches on model_config.quantization, which a checkpoint's
    `quantization_config` sets: the profile carries whether there is one."""
    config = json.loads((MODELS / "nemotron-3-nano-30b-a3b" / "config.json").read_text())
    assert not model_profile(str(MODELS / "nemotron-3-nano-30b-a3b"), 58.82).quantized
    (tmp_path / "config.json").write_text(json.dumps(
        {**config, "quantization_config": {"quant_method": "fp8"}}))
    assert model_profile(str(tmp_path), 31.0).quantized


def test_lfm2_moe_reads_its_leading_dense_layers_as_sglang_does() -> None:
    """`Lfm2MoeDecoderLayer` builds a dense MLP below `num_dense_layers` (srt/models/
    lfm2_moe.py): LFM2-8B-A1B has 22 MoE layers, not 24, and 1.56 B active parameters (all
    24 counted as MoE put it at 0.94 B, more experts than its weights hold)."""
    lfm2_moe = model_profile(str(MODELS / "lfm2-8b-a1b"), 15.53)
    assert lfm2_moe.moe is not None
    assert lfm2_moe.moe.moe_layers == 22
    assert lfm2_moe.active_params_b == pytest.approx(1.555, abs=0.01)


def test_an_unmeasured_family_under_unmeasured_routing_is_not_called_measured() -> None:
    """LFM2-8B-A1B on an H100: no conv fit anywhere and no entry of the H100's own, so the
    H200's (the 27B's) prices it; the note says so instead of "measured as" them."""
    lfm2_moe = model_profile(str(MODELS / "lfm2-8b-a1b"), 15.53)
    note = calibration_note(gpu_profile("h100"), lfm2_moe, parse_server_flags(list(DUMMY),
                                                                                V0517))
    assert not note.calibrated and note.dummy_routing_unmeasured
    assert note.describe().startswith(
        "step model not measured for this family on this GPU (nearest: H200, a GPU of its "
        "generation); the random-weight router's spread over Lfm2MoeForCausalLM's experts")
    assert note.describe().endswith("expect ±50%")
