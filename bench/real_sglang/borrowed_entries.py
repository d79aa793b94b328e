"""What a family no fit has met is priced with, tried on the families that have been met.

An MoE hybrid of a family with no step fit of its own (LFM2-MoE's conv layers, say) takes
the entry `calibration_key` falls back to: its GPU's own, else its generation's (the H200's,
fitted on the dense Qwen3.6-27B), else the seeds' RTX PRO 6000 fit. This replays every H100
MoE run `fit_h100` reads (its fitted parts and the held-out one) with each candidate entry in
turn and prints the error of each against what the server did: how wrong a never-met family
would be, and which fallback is least wrong. NemotronH's spread under dummy weights is
measured only in its own entry; in the others it takes the router prior
(roofline.dummy_spread_prior), and the last line shows it priced as a trained router instead.

  .venv/bin/python bench/real_sglang/borrowed_entries.py
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from typing import Any

import fit_h100 as fit

from infra.sglang.roofline import DEFAULT_CALIBRATION, StepCalibration, measured_calibrations

OWN = fit.ENTRY  # the H100's Mamba2 + MoE fit: what these models are priced with today
# what a family with no fit takes on a Hopper GPU, and the entries it might have taken
CANDIDATES = (OWN, "H200", "H200/gdn-moe", "seeds")


def calibration(name: str, trained_spread: bool = False) -> StepCalibration:
    """The entry's constants; `trained_spread`: every architecture the entry did not measure
    spread over all its experts (as before the router prior: roofline.dummy_spread_prior)."""
    cal = DEFAULT_CALIBRATION if name == "seeds" else measured_calibrations()[name]
    if not trained_spread:
        return cal
    measured = dict(cal.dummy_routed_spread)
    unmeasured = {arch: 1.0 for arch in ("NemotronHForCausalLM",) if arch not in measured}
    return replace(cal, dummy_routed_spread=tuple({**measured, **unmeasured}.items()))


def errors(entry: str, trained_spread: bool = False) -> dict[str, float]:
    """Server name → replayed rate / measured rate - 1, every run priced with `entry`."""
    cal = calibration(entry, trained_spread)
    out: dict[str, float] = {}
    for rec in fit.servers(fit.PARTS + fit.HELD_OUT):
        for run in rec["runs"]:
            if "skipped" in run:
                continue
            measured = fit.measured_rate(run)
            out[f"{rec['name']}/{run['name']}"] = fit.replayed_rate(rec, run, cal) / measured - 1
    return out


def median_miss(found: dict[str, float], family: str) -> float:
    """Median |error| over one family's runs (`gt`/`gs`: Granite, `nh`: NemotronH)."""
    return statistics.median(abs(e) for name, e in found.items() if name.startswith(family))


def main() -> None:
    table: dict[str, dict[str, Any]] = {name: errors(name) for name in CANDIDATES}
    runs = list(table[OWN])
    print(f"{'run':44}" + "".join(f"{name:>22}" for name in CANDIDATES))
    for run in runs:
        print(f"{run[:44]:44}" + "".join(f"{table[name][run]:>+22.0%}" for name in CANDIDATES))
    for family, label in (("g", "Granite, median |error|"), ("nh", "NemotronH, median |error|")):
        print(f"{label:44}" + "".join(f"{median_miss(table[name], family):>22.0%}"
                                      for name in CANDIDATES))
    before = {name: errors(name, trained_spread=True) for name in CANDIDATES}
    print(f"{'NemotronH, priced as a trained router':44}" + "".join(
        f"{median_miss(before[name], 'nh'):>22.0%}" for name in CANDIDATES))


if __name__ == "__main__":
    main()
