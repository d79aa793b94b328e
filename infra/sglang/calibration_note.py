"""How far to trust a plan's rates: which measured step constants it uses, and what they never saw.

`expansion plan` prints this under every plan (and `plan --json` carries it), so a user on a
model no device run has met sees an uncertainty instead of one confident number. Three things
widen it: the model's kind never ran on this GPU (the seeds' fit, or a sibling GPU's); its
size is far from every model the entry was fitted on (Granite-Small priced by Tiny's fit ran
10-24 % below the plan); or it is an MoE served with random weights (`--load-format dummy`)
whose router's spread over the experts was never measured — a random router sends a batch to
few experts or to many depending on its kind (Kimi-Linear's and NemotronH's grouped sigmoid
router with a correction bias: 0.02 of them; Qwen3.5's softmax: 0.8), and priced as a trained
router Nemotron-3-Nano-30B-A3B's blind H100 plan ran 38-66 % below the server. And the
experts may run on a kernel no fit ran: with no `--moe-runner-backend`, SGLang 0.5.17 gives an
unquantized NemotronH on Hopper `flashinfer_cutlass` (release_tables: `cutlass_moe_archs`), whose
first start on the H100 was still autotuning 480 s after its weights loaded; every fit ran triton.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from infra.sglang.flags import ServerFlags
from infra.sglang.profiles import GpuProfile, ModelProfile
from infra.sglang.release_tables import tables_for
from infra.sglang.roofline import (
    _calibration_table,
    calibration_for,
    calibration_key,
    dummy_weights,
)
from infra.sglang.versions import SGLangVersion


@dataclass(frozen=True)
class CalibrationNote:
    """Which measured constants a prediction uses, and how far to trust it: `calibrated` when
    this model's family (and, for an MoE, its expert regime) ran on this GPU; `extrapolated`
    when it did, but only at model sizes far from this one's; `dummy_routing_unmeasured` when
    random weights route its experts in a way no run measured."""

    key: str
    calibrated: bool
    uncertainty: float  # the relative error to expect (the fits' worst residual, or a guess)
    borrowed: bool = False  # the entry is another GPU's of the same generation
    # the active parameters (billions) of the models the entry was fitted on, when it says
    fitted_active_params_b: tuple[float, float] | None = None
    extrapolated: bool = False
    active_params_b: float = 0.0  # this model's
    dummy_routing_unmeasured: bool = False
    architecture: str = ""
    unmeasured_moe_runner: str = ""  # the runner SGLang picks here that no fit ran
    biased_router: bool = False  # its unmeasured spread is priced as top-k alone

    def describe(self) -> str:
        said = self._measured()
        if self.dummy_routing_unmeasured:
            said += (f"; the random-weight router's spread over {self.architecture}'s experts "
                     "was never measured " + (
                         "(it adds a per-expert bias, so every token is priced on the same "
                         "top-k experts, as Kimi-Linear's and NemotronH's ran)"
                         if self.biased_router else
                         "(dummy weights send a batch to few experts or many)"))
        if self.unmeasured_moe_runner:
            said += (f"; SGLang runs its experts on {self.unmeasured_moe_runner} here (no "
                     "--moe-runner-backend given), a runner no fit measured (its first H100 "
                     "start autotuned past 8 minutes; --moe-runner-backend triton is measured)")
        if self.dummy_routing_unmeasured or self.unmeasured_moe_runner:
            said += f", expect ±{self.uncertainty:.0%}"
        return said

    def _widened(self) -> bool:
        return self.dummy_routing_unmeasured or bool(self.unmeasured_moe_runner)

    def _measured(self) -> str:
        if self.extrapolated and self.fitted_active_params_b:
            low, high = self.fitted_active_params_b
            return (f"step model measured as {self.key} on models of {low:g}-{high:g} B active "
                    f"parameters, not this one's {self.active_params_b:.3g} B"
                    + ("" if self._widened() else f"; expect ±{self.uncertainty:.0%}"))
        widened = self._widened()  # describe() then gives the bound after the causes
        if self.calibrated:
            return (f"step model measured as {self.key}"
                    + ("" if widened else f" (expect ±{self.uncertainty:.0%})"))
        return (f"step model not measured for this family on this GPU (nearest: {self.key}"
                f"{', a GPU of its generation' if self.borrowed else ''})"
                + ("" if widened else
                   f"; expect ±{self.uncertainty:.0%} until a run measures it"))


CALIBRATED_ERROR = 0.15  # the device checks' bound (tests/unit/test_real_*.py)
UNCALIBRATED_ERROR = 0.5  # the MoE hybrids' rates before their fit ran 20-70 % high
# Granite-4.0-H-Small (8.8 B active) priced by a fit on Granite-Tiny's shapes alone (1.5 B):
# its four H100 waves ran 10-24 % below the plan (tests/unit/test_real_granite_small_h100.py)
EXTRAPOLATED_ERROR = 0.25
# How far past the fitted sizes a model is still within them: no measurement says how the
# error grows between 1× and Small's 6×, so half as far again either way
SIZE_MARGIN = 1.5


@functools.cache
def fitted_sizes() -> dict[str, tuple[float, float]]:
    """Entry → (fewest, most) active parameters, in billions, of the models it was fitted on
    (the fits write it; an entry without it says nothing about size)."""
    raw = _calibration_table()
    return {key: (float(v["active_params_b"][0]), float(v["active_params_b"][1]))
            for key, v in raw.items() if "active_params_b" in v}


def calibration_note(gpu: GpuProfile, model: ModelProfile, flags: ServerFlags | None = None,
                     version: SGLangVersion | None = None) -> CalibrationNote:
    """Calibrated when the constants were fitted on this model's kind: its MoE entry for an
    MoE, its family's for a dense-MLP hybrid (the GPU's own for GDN: fitted on the 27B).
    Extrapolated when that entry's models were all much smaller or larger than this one.
    Unmeasured dummy routing (with `flags` that load random weights) and a MoE runner no fit
    ran (with `flags` and `version`) are as unsure as no calibration at all: the blind
    Nemotron-30B plan was off by more than any other cause."""
    key = calibration_key(gpu, model)
    own = (f"{gpu.name}/{model.family}",
           gpu.name if model.family == "gdn" else f"{gpu.name}/{model.family}")
    here = key is not None and key.split("/")[0] == gpu.name  # not a sibling GPU's
    measured = here and (key or "").endswith("-moe") if model.moe else here and key in own
    sizes = fitted_sizes().get(key or "")
    far = sizes is not None and not (sizes[0] / SIZE_MARGIN <= model.active_params_b
                                     <= sizes[1] * SIZE_MARGIN)
    routing = (model.moe is not None and flags is not None and dummy_weights(flags)
               and model.architecture not in dict(calibration_for(gpu, model)
                                                  .dummy_routed_spread))
    runner = default_moe_runner(gpu, model, flags, version)
    uncertainty = ((EXTRAPOLATED_ERROR if far else CALIBRATED_ERROR) if measured
                   else UNCALIBRATED_ERROR)
    return CalibrationNote(key or "the seeds' RTX PRO 6000 fit", measured,
                           UNCALIBRATED_ERROR if routing or runner else uncertainty,
                           borrowed=key is not None and not here, fitted_active_params_b=sizes,
                           extrapolated=measured and far, active_params_b=model.active_params_b,
                           dummy_routing_unmeasured=routing, architecture=model.architecture,
                           biased_router=bool(routing and model.moe and model.moe.biased_router),
                           unmeasured_moe_runner=runner)


def default_moe_runner(gpu: GpuProfile, model: ModelProfile, flags: ServerFlags | None,
                       version: SGLangVersion | None) -> str:
    """"flashinfer_cutlass" where the release's override for this architecture picks it (an
    unquantized checkpoint, no --moe-runner-backend, a Hopper GPU: the branch before SM100's
    trtllm), else "" (the fused triton kernels every fit ran)."""
    if model.moe is None or flags is None or version is None or gpu.generation != "hopper":
        return ""
    tables = tables_for(version)
    named = any(a.startswith("--moe-runner-backend") for a in flags.extra_args)
    if (tables is None or named or model.quantized
            or model.architecture not in tables.cutlass_moe_archs):
        return ""
    return "flashinfer_cutlass"
