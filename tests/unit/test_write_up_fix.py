"""The write-up's hand fix among `expansion plan`'s alternatives (infra/sglang/planner.py):
named by what it moves on these flags, and absent where it would move nothing."""

from __future__ import annotations

from pathlib import Path

from infra.sglang.flag_parser import parse_server_flags
from infra.sglang.planner import alternatives
from infra.sglang.profiles import gpu_profile, model_profile
from infra.sglang.versions import parse_version

MODELS = Path(__file__).resolve().parents[2] / "bench" / "real_sglang" / "models"
SMALL = model_profile(str(MODELS / "granite-4.0-h-small"), 60.03)
V0517 = parse_version("0.5.17")


def labels(argv: list[str]) -> list[str]:
    rows = alternatives(SMALL, gpu_profile("h100"), parse_server_flags(argv, V0517), V0517)
    return [row.label for row in rows]


def test_a_fraction_past_090_is_not_named_090_and_a_no_op_fix_is_left_out() -> None:
    """no_buffer at 0.93 with 28 requests' pools: the fix would move only the default cap to
    128, which those pools never reach (it used to show as 'mem 0.90', equal to current)."""
    said = labels(["--mamba-radix-cache-strategy", "no_buffer", "--mamba-ssm-dtype",
                   "bfloat16", "--mem-fraction-static", "0.93"])
    assert not [label for label in said if "cap 128" in label or "mem 0.90" in label]


def test_the_default_flags_get_the_whole_fix_named() -> None:
    assert "no_buffer + mem 0.90 + cap 128 together" in labels([])
