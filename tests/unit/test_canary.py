"""The canary's arithmetic: group rates over one window, the fleet's lowest fraction during a
cycle, counters that restart with their server, and the shared-GPU rule of the policy."""

from __future__ import annotations

from infra.sglang.flags import ServerFlags
from tasks.monitor import Sample
from tasks.tuning.canary import CanaryCycle, group_rates, min_fleet_fraction
from tasks.tuning.diagnosis import counted_tokens, window_stats
from tasks.tuning.policy import keep_memory, pools_pinned


def series(server: str, rate: float, t0: float, t1: float, start: float = 0.0,
           restart_at: float | None = None) -> list[Sample]:
    out, t, count = [], t0, start
    while t <= t1:
        if restart_at is not None and abs(t - restart_at) < 1e-9:
            count = 0.0
        out.append(Sample(t, 1, server, True, 10, 0, 0.1, 0.5, rate, count))
        t += 1.0
        count += rate
    return out


def test_counter_drop_is_a_restart_not_negative_tokens() -> None:
    assert counted_tokens([0, 100, 200, 50, 150]) == 200 + 50 + 100
    rows = series("s", 100.0, 0, 20, start=5000, restart_at=10)
    (window,) = window_stats(rows, 0.0, 1.0)
    assert 90 < window.tok_s <= 100  # one tick lost to the restart, never a negative rate


def test_group_rates_compare_canary_with_the_rest_over_one_window() -> None:
    samples = (series("server-0", 100, 0, 30) + series("server-1", 100, 0, 30)
               + series("server-2", 150, 0, 30))
    canary, control = group_rates(samples, 10, 30, {"server-2"}, 1.0)
    assert canary == 150 and control == 100
    cycle = CanaryCycle("x", ["server-2"], 1.4, 0.0, canary_tok_s=canary, control_tok_s=control)
    assert cycle.measured_gain == 1.5
    assert abs((cycle.prediction_error or 0) - (1 - 1.4 / 1.5)) < 1e-9


def test_min_fleet_fraction_sees_one_server_of_four_out() -> None:
    # Four servers at 100 tok/s; server-3 is out (no samples answer) from t=20 to t=40.
    samples = [s for name in ("server-0", "server-1", "server-2")
               for s in series(name, 100, 0, 60)]
    samples += [s for s in series("server-3", 100, 0, 60) if not 20 <= s.t <= 40]
    frac = min_fleet_fraction(samples, 20, 40, 10.0)
    assert frac is not None and 0.74 <= frac <= 0.76


def test_scrapes_that_time_out_on_a_busy_client_are_not_a_stopped_server() -> None:
    """server-2's scrapes go unanswered from t=25 to 30 (its counter kept counting: a busy
    client machine); server-3 restarts over t=21..40 (its counter starts again from 0). Only
    the restart lowers the fleet: three of four servers, not two."""
    from dataclasses import replace

    samples = [s for name in ("server-0", "server-1") for s in series(name, 100, 0, 60)]
    samples += [replace(s, alive=False, gen_throughput=None) if 25 <= s.t <= 30 else s
                for s in series("server-2", 100, 0, 60)]
    samples += [replace(s, alive=False, gen_throughput=None) if 21 <= s.t <= 40 else s
                for s in series("server-3", 100, 0, 60, start=9000, restart_at=41)]
    frac = min_fleet_fraction(samples, 20, 45, 5.0)
    assert frac is not None and 0.74 <= frac <= 0.76


def test_pinned_pools_keep_every_memory_flag() -> None:
    flags = ServerFlags(mamba_strategy="extra_buffer", mem_fraction_static=0.25,
                        max_total_tokens=400000, max_mamba_cache_size=600)
    assert pools_pinned(flags, hybrid=True)
    assert not pools_pinned(flags.with_changes(max_mamba_cache_size=None), hybrid=True)
    assert pools_pinned(flags.with_changes(max_mamba_cache_size=None), hybrid=False)
    move = flags.with_changes(mamba_strategy="no_buffer", mem_fraction_static=0.9,
                              max_mamba_cache_size=None, max_running_requests=256)
    kept = keep_memory(move, flags)
    assert kept.mamba_strategy == "no_buffer" and kept.max_running_requests == 256
    assert (kept.mem_fraction_static, kept.max_total_tokens, kept.max_mamba_cache_size) == (
        0.25, 400000, 600)


def test_a_canary_that_keeps_retracting_is_a_thrash() -> None:
    from dataclasses import replace

    from tasks.tuning.canary import group_means, thrashes

    calm = series("server-0", 100, 0, 20)
    busy = [replace(s, server="server-1", retracted=3.0, cache_hit_rate=0.1)
            for s in series("server-1", 160, 0, 20)]
    ours, theirs = group_means(calm + busy, 5, 20, {"server-1"}, "retracted")
    assert (ours, theirs) == (3.0, None)
    cycle = CanaryCycle("x", ["server-1"], 1.5, 0.0, canary_tok_s=160, control_tok_s=100,
                        canary_retracted=ours, control_retracted=theirs)
    assert thrashes(cycle)  # faster on paper, but it is taking requests back
    assert not thrashes(CanaryCycle("x", ["server-1"], 1.5, 0.0, canary_retracted=0.2))
