"""The first-wave misjudgement, replayed on the simulator's own scheduler in modeled time.

A canary restarted into no_buffer (the Qwen3.6-27B shapes on an H200: cap 82) beside servers
that have run extra_buffer (cap 49) for minutes, every server answering outputs of a reasoning
model's lengths (lognormal, mean 1,000, p99 8,000 tokens). The canary's batch starts at once,
so over its first windows only its short answers have finished: the finished-token counter,
which the judge once read, has it at two thirds of the control while it is in fact ~1.19×
faster (what real SGLang measured for this move at 1,024 + 256: 1.19×). Deterministic: the
same scheduler, the same request list, no wall clock (tests/unit/test_judge.py models the
counters by hand; this replays them).
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache
from pathlib import Path

import pytest

from infra.sglang.flag_parser import parse_server_flags
from infra.sglang.flags import ServerFlags
from infra.sglang.hardware import Hardware
from infra.sglang.profiles import gpu_profile, model_profile
from infra.sglang.versions import parse_version
from infra.sim.predict import Workload
from tasks.monitor import Sample
from tasks.tuning.canary import MIN_JUDGE_WINDOWS
from tasks.tuning.judge import group_rates
from tests.modeled import ModeledServer, first_verdict, sampled_server

MODEL = Path(__file__).resolve().parents[1] / "fixtures" / "models" / "qwen3.6-27b-text"
WINDOW = 20.0
UNTIL = 8 * WINDOW
TICK = 0.5  # the monitor's sample interval
BAR = 1.03  # tuning.canary_min_gain's default


def _flags(strategy: str) -> ServerFlags:
    return parse_server_flags(["--mem-fraction-static", "0.9",
                               "--mamba-radix-cache-strategy", strategy])


@cache
def fleet() -> tuple[Sample, ...]:
    """server-3 restarted into no_buffer at t=0, beside three servers that ran extra_buffer
    for 200 s (one replayed, its series copied); each client keeps the cap plus four out."""
    hw = Hardware(model_profile(str(MODEL), 50.16), gpu_profile("h200"),
                  parse_version("0.5.17"))
    lengths = Workload(1024, 1000, 8000).output_lengths(20000)
    canary = sampled_server(hw, ModeledServer("server-3", _flags("no_buffer")), 1024, lengths,
                            UNTIL, TICK)
    control = sampled_server(hw, ModeledServer("server-0", _flags("extra_buffer"), 200.0),
                             1024, lengths, UNTIL, TICK)
    rows = canary + [replace(s, server=f"server-{i}") for s in control for i in range(3)]
    return tuple(sorted(rows, key=lambda s: (s.t, s.server)))


def test_finished_counters_over_the_first_windows_read_the_faster_move_as_slower() -> None:
    finished_only = [replace(s, decode_tokens_total=None) for s in fleet()]
    first, firsts = group_rates(finished_only, WINDOW, MIN_JUDGE_WINDOWS * WINDOW,
                                {"server-3"}, 1.0)
    steady, steadies = group_rates(list(fleet()), UNTIL / 2, UNTIL, {"server-3"}, 1.0)
    assert first is not None and firsts is not None and first / firsts < 0.8
    assert steady is not None and steadies is not None and steady / steadies > 1.1


def test_the_judge_waits_for_the_turnover_and_rolls_the_faster_move_out() -> None:
    rows = list(fleet())
    steady, steadies = group_rates(rows, UNTIL / 2, UNTIL, {"server-3"}, 1.0)
    assert steady is not None and steadies is not None
    verdict = first_verdict(rows, WINDOW, MIN_JUDGE_WINDOWS * WINDOW, UNTIL, {"server-3"}, BAR)
    assert verdict is not None and verdict.decision == "better", verdict
    assert verdict.gain == pytest.approx(steady / steadies, rel=0.10)
