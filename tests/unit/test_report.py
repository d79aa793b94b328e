"""The run report: a real PNG with axes, rates that never invent a zero, the image embedded
in the Prefect artifact, and a summary that says which clock its tok/s are in."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from flows.report import restart_times, token_rates, write_report
from flows.summary import format_summary, summary_lines
from tasks.monitor import Sample


def sample(t: float, server: str, tokens: float | None, epoch: int = 1) -> Sample:
    return Sample(t=t, epoch=epoch, server=server, alive=True, running=10, queued=0,
                  kv_usage=0.2, mamba_usage=0.6, gen_throughput=None,
                  generation_tokens_total=tokens)


def summary(time_scale: float) -> dict:
    """A flow result as JSON (flows.summary.RunSummary.model_dump())."""
    return {"output": "/out", "prompts_total": 10, "prompts_done_this_run": 10,
            "errors_this_run": 0, "already_committed": 0, "output_tokens": 2000,
            "seconds": 10.0, "tok_s": 200.0, "tok_s_modeled_gpu_time": 200.0 / time_scale,
            "time_scale": time_scale, "restarts": 1, "capacity_note": "",
            "servers": [{"url": "http://h:1", "max_running_requests": 31,
                         "max_total_num_tokens": 1000, "max_mamba_cache_size": 158}],
            "cycles": [{"epoch": 1, "diagnosis": "mamba-bound", "reason": "r",
                        "measured_tok_s_per_gpu": 100.0,
                        "new_flags": {"mamba_strategy": "no_buffer"}}],
            "answers_redone_after_drains": 0, "final_server_flags": {}}


def test_first_sample_gives_no_rate_and_a_restarted_counter_starts_over() -> None:
    rates = token_rates([sample(1, "a", 100), sample(2, "a", 300), sample(3, "a", 50),
                         sample(4, "a", 150)], time_scale=1.0)
    assert rates["a"] == [(2, 200.0), (4, 100.0)]
    assert token_rates([sample(1, "a", 100), sample(2, "a", 300)], 20.0)["a"] == [(2, 10.0)]


def test_a_trailing_window_smooths_a_counter_that_moves_in_waves() -> None:
    """Real SGLang counts a request's tokens when it ends: 0, 0, +600, 0, 0, +600 …"""
    counts = [0, 0, 600, 600, 600, 1200, 1200, 1200, 1800]
    samples = [sample(t, "a", c) for t, c in enumerate(counts)]
    per_step = [r for _, r in token_rates(samples, 1.0)["a"]]
    assert per_step == [0.0, 600.0, 0.0, 0.0, 600.0, 0.0, 0.0, 600.0]
    windowed = [r for _, r in token_rates(samples, 1.0, window_s=6.0)["a"]]
    assert windowed[-3:] == [200.0, 200.0, 200.0]


def test_restarts_are_found_from_epochs() -> None:
    samples = [sample(1, "a", 1), sample(5, "a", 2, epoch=2), sample(6, "a", 3, epoch=2)]
    assert restart_times(samples) == [(5, 2)]


def test_report_png_is_embedded_in_the_artifact(tmp_path: Path) -> None:
    samples = [sample(t, s, 100.0 * t, epoch=1 if t < 6 else 2)
               for t in range(1, 12) for s in ("server-0", "server-1")]
    md_path, artifact = write_report(tmp_path, summary(20.0), samples, summary(20.0)["cycles"],
                                     20.0, {1: {"server-0": 31, "server-1": 31},
                                            2: {"server-0": 63, "server-1": 63}})
    png = (tmp_path / "report.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    assert "](report.png)" in md_path.read_text()
    encoded = artifact.split("data:image/png;base64,", 1)[1].split(")", 1)[0]
    assert base64.b64decode(encoded) == png
    written = json.loads((tmp_path / "summary.json").read_text())  # for scripts
    assert {k: written[k] for k in summary(20.0)} == summary(20.0)
    assert written["generating_s"] == 0.0  # a field the flow fills, there with its default


def test_summary_splits_start_up_from_generating() -> None:
    """The rate while generating is what SGLang's own benchmark reports (bench/real_sglang/
    vs_bench.py compares the two); start-ups are what a restart costs."""
    lines = summary_lines({**summary(1.0), "startup_s": 95.5, "generating_s": 4.0})
    assert "time: 95.5 s starting servers, 4.0 s generating = 500.0 tok/s while generating" in lines
    assert not any(line.startswith("time:") for line in summary_lines(summary(1.0)))


def test_summary_says_which_clock() -> None:
    sim = format_summary(summary(20.0))
    assert sim.startswith("run summary\n")
    assert "time_scale 20" in sim and "10.0 tok/s" in sim  # 200 wall ÷ 20
    real = summary_lines(summary(1.0))
    assert not any("simulated" in line for line in real)
    assert "tuning cycles: 1; epoch 1: mamba-bound → fleet restarted with no_buffer" in real


def test_summary_says_what_the_client_keeps_in_flight_when_it_is_set() -> None:
    """The server's cap is not what a run with client.concurrency_per_server sent."""
    assert "servers: 1, concurrency cap 31 each" in summary_lines(summary(1.0))
    capped = summary_lines({**summary(1.0), "client_concurrency": 12})
    assert ("servers: 1, concurrency cap 31 each; the client keeps 12 in flight per server "
            "(client.concurrency_per_server)") in capped


def test_summary_says_when_groups_were_primed() -> None:
    base = {**summary(1.0), "prompt_tokens": 1000, "cached_tokens": 900,
            "prefix_affinity_chars": 1024}
    plain = summary_lines(base)
    assert "prefix cache: 90.0% of 1,000 prompt tokens reused; prefix affinity on (first " \
           "1,024 characters)" in plain
    assert not any("primed" in line for line in plain)
    primed = summary_lines({**base, "primers": 1200})
    assert any(line.endswith("; 1,200 groups primed (their shared prefix sent first: "
                             "no_buffer)") for line in primed)


def test_summary_says_how_a_canary_ended() -> None:
    from flows.summary import cycle_line

    line = cycle_line({"epoch": 1, "diagnosis": "request-capped", "canary": {
        "canary_servers": ["server-2"], "outcome": "rolled_back", "measured_gain": 0.96,
        "predicted_gain": 1.52, "server_restarts": 2}})
    assert line == ("epoch 1: request-capped → canary on server-2 rolled back, measured 0.96× "
                    "(predicted 1.52×), 2 server restarts")


def test_lines_break_where_sampling_stopped() -> None:
    """A restart's gap is not drawn as a line through values nobody measured."""
    import math

    from flows.report import _gapped

    xs, ys = _gapped([(0, 1.0), (1, 2.0), (10, 3.0)], max_gap=2.5)
    assert xs == [0, 1, 1, 10] and math.isnan(ys[2]) and ys[3] == 3.0


def test_report_table_says_how_each_cycle_ended() -> None:
    from flows.report import _cycle_row

    row = _cycle_row({"epoch": 1, "diagnosis": "request-capped", "measured_tok_s_per_gpu": 8075.0,
                      "predicted_tok_s_per_gpu": 15013.3, "reason": "canary rolled_back — …",
                      "canary": {"canary_servers": ["server-2"], "outcome": "rolled_back",
                                 "measured_gain": 0.96}})
    assert row == ("| 1 | request-capped | 8,075 | 15,013 | canary on server-2 | rolled back, "
                   "0.96× measured | canary rolled_back — … |")


def test_a_short_run_is_drawn_with_dots_and_a_window_it_can_fill() -> None:
    """A one-minute smoke test has two or three samples per server: lines alone between
    them were easy to miss, and a 30-s trailing rate window held the whole run."""
    from flows.report import _marks, plot_png, rate_window

    assert _marks([(1.0, 2.0)] * 3) == {"marker": "o", "ms": 3}
    assert _marks([(float(t), 2.0) for t in range(100)]) == {}
    samples = [sample(t, "server-0", 500.0 * t) for t in (60.0, 65.0, 70.0)]
    png = plot_png(samples, {1: {"server-0": 120}}, 1.0, 77.0, "wall clock")
    assert png.startswith(b"\x89PNG")
    assert rate_window(3.0, 7200.0) == 30.0  # a long job: ten samples
    assert rate_window(5.0, 77.0) == 7.7  # a minute's run: a tenth of it
