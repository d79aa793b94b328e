"""The end-of-run report: a markdown summary and a PNG of what the fleet did over the run.

Both are written next to the output (`report.md`, `report.png`); the flow also publishes the
markdown as a Prefect artifact with the PNG embedded (a data: URI, so the artifact shows
the picture wherever it is read, with no file server behind it). The plot has three panels
on one time axis — output tok/s per server and for the fleet, running requests against each
server's cap, KV and mamba pool usage per server — from the first sample to the end of the
run, with every restart marked. Drawn with matplotlib (Agg, no display needed).
"""

from __future__ import annotations

import base64
import io
import itertools
from collections import defaultdict
from pathlib import Path
from typing import Any

from flows.summary import RunSummary, summary_lines
from tasks.monitor import Sample

Series = dict[str, list[tuple[float, float]]]


FEW_SAMPLES = 12  # below this many points a series is drawn with dots
# The trailing window of the token-rate panel, in monitor samples (30 s at the default 3 s).
RATE_WINDOW_SAMPLES = 10


def token_rates(samples: list[Sample], time_scale: float, window_s: float = 0.0) -> Series:
    """Per server: (t, output tok/s) from its token counter, over a trailing window.

    Real SGLang adds a request's tokens to `generation_tokens_total` when the request ends,
    so between two 3-second samples the counter often does not move at all: a rate over
    `window_s` (from the oldest sample inside it) shows the speed, not the finishing waves.
    0 means between consecutive samples. A server's first sample gives no point (never a 0
    it did not measure); a counter that went back (a restarted server) starts over. tok/s
    are in the clock of `time_scale` (1: wall clock; the simulator's: modeled GPU time)."""
    rates: Series = defaultdict(list)
    history: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for s in sorted(samples, key=lambda s: s.t):
        if s.generation_tokens_total is None:
            continue
        past = history[s.server]
        if past and s.generation_tokens_total < past[-1][1]:
            past.clear()  # restarted: its counter began again
        inside = [p for p in past if p[0] >= s.t - window_s] or past[-1:]
        if inside and s.t > inside[0][0]:
            t0, c0 = inside[0]
            rates[s.server].append((s.t, (s.generation_tokens_total - c0) / (s.t - t0)
                                    / time_scale))
        past.append((s.t, s.generation_tokens_total))
    return dict(rates)


def fleet_rate(rates: Series, bucket_s: float) -> list[tuple[float, float]]:
    """Sum of the servers' rates per time bucket (the monitor samples all servers per tick)."""
    buckets: dict[int, float] = defaultdict(float)
    for points in rates.values():
        for t, rate in points:
            buckets[int(t // bucket_s)] += rate
    return [((k + 1) * bucket_s, v) for k, v in sorted(buckets.items())]


def restart_times(samples: list[Sample]) -> list[tuple[float, int]]:
    """(time of the first sample of epoch N, N) for every epoch after the first."""
    first: dict[int, float] = {}
    for s in samples:
        first[s.epoch] = min(first.get(s.epoch, s.t), s.t)
    return sorted((t, e) for e, t in first.items() if e > 1)


def plot_png(samples: list[Sample], caps_by_epoch: dict[int, dict[str, int]], time_scale: float,
             run_seconds: float, clock: str) -> bytes:
    """The three-panel figure as PNG bytes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_tok, ax_run, ax_pool) = plt.subplots(3, 1, figsize=(10, 8), sharex=True,
                                                  constrained_layout=True)
    interval = _sample_interval(samples)
    window = rate_window(interval, run_seconds)
    rates = token_rates(samples, time_scale, window)
    gap = 2.5 * interval
    top = 0.0
    for server, points in sorted(rates.items()):
        ax_tok.plot(*_gapped(points, gap), lw=1, label=server, **_marks(points))
        top = max([top, *(v for _, v in points)])
    if len(rates) > 1:
        fleet = fleet_rate(rates, interval)
        ax_tok.plot(*_gapped(fleet, gap), lw=2, color="black", label="fleet", **_marks(fleet))
        top = max([top, *(v for _, v in fleet)])
    ax_tok.set_ylabel("output tok/s")
    ax_tok.set_ylim(0, 1.15 * top if top > 0 else None)  # the fleet line clear of the frame
    ax_tok.set_title(f"output tok/s from generation_tokens_total ({clock}; "
                     f"{window:.0f}-s window)")
    _running_panel(ax_run, samples, caps_by_epoch, gap)
    _pool_panel(ax_pool, samples, gap)
    end = max([run_seconds, *(s.t for s in samples)])
    for ax in (ax_tok, ax_run, ax_pool):
        ax.set_xlim(0, end)
        ax.grid(alpha=0.3)
        for t, epoch in restart_times(samples):
            ax.axvline(t, color="tab:red", ls="--", lw=1)
            if ax is ax_tok:
                ax.annotate(f"restart → epoch {epoch}", (t, 1), xycoords=("data", "axes fraction"),
                            xytext=(3, -12), textcoords="offset points", color="tab:red",
                            fontsize=8)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="upper left", fontsize=8, ncols=4)
    ax_pool.set_xlabel("seconds since the run started (wall clock)")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return buf.getvalue()


def _gapped(points: list[tuple[float, float]], max_gap: float) -> tuple[list[float], list[float]]:
    """x and y with a NaN wherever samples stop for longer than `max_gap` (a restart, a
    server down): the line breaks there instead of drawing values nobody measured."""
    xs: list[float] = []
    ys: list[float] = []
    for t, v in sorted(points):
        if xs and t - xs[-1] > max_gap:
            xs.append(xs[-1])
            ys.append(float("nan"))
        xs.append(t)
        ys.append(v)
    return xs, ys


def rate_window(interval: float, run_seconds: float) -> float:
    """The token-rate panel's trailing window: RATE_WINDOW_SAMPLES samples, but at most a
    tenth of the run, so that a short run (a first smoke test) still shows a rate."""
    return min(RATE_WINDOW_SAMPLES * interval, max(interval, run_seconds / 10))


def _marks(points: list[tuple[float, float]]) -> dict[str, Any]:
    """Dots on a line of few samples: a run of a minute has two or three per server, and a
    line between them alone is easy to miss (or, for one sample, not drawn at all)."""
    return {"marker": "o", "ms": 3} if len(points) < FEW_SAMPLES else {}


def _sample_interval(samples: list[Sample]) -> float:
    times = sorted({round(s.t, 1) for s in samples})
    gaps = sorted(b - a for a, b in itertools.pairwise(times) if b > a)
    return gaps[len(gaps) // 2] if gaps else 1.0


def _running_panel(ax: Any, samples: list[Sample], caps_by_epoch: dict[int, dict[str, int]],
                   gap: float) -> None:
    by_server: Series = defaultdict(list)
    for s in samples:
        if s.running is not None:
            by_server[s.server].append((s.t, float(s.running)))
    for i, (server, points) in enumerate(sorted(by_server.items())):
        color = f"C{i % 10}"
        ax.plot(*_gapped(points, gap), lw=1, color=color, label=f"{server} running",
                **_marks(points))
        for epoch, span in _epoch_spans(samples).items():
            cap = caps_by_epoch.get(epoch, {}).get(server)
            if cap is not None:
                ax.hlines(cap, *span, colors=color, linestyles=":", lw=1.5)
    ax.set_ylim(bottom=0)
    ax.set_ylabel("requests")
    ax.set_title("running requests (solid) against each server's measured cap (dotted)")


def _pool_panel(ax: Any, samples: list[Sample], gap: float) -> None:
    kv: Series = defaultdict(list)
    mamba: Series = defaultdict(list)
    for s in samples:
        if s.kv_usage is not None:
            kv[s.server].append((s.t, 100 * s.kv_usage))
        if s.mamba_usage is not None:
            mamba[s.server].append((s.t, 100 * s.mamba_usage))
    for i, server in enumerate(sorted(set(kv) | set(mamba))):
        color = f"C{i % 10}"
        if kv.get(server):
            ax.plot(*_gapped(kv[server], gap), lw=1, color=color, label=f"{server} KV",
                    **_marks(kv[server]))
        if mamba.get(server):
            ax.plot(*_gapped(mamba[server], gap), lw=1, color=color, ls="--",
                    label=f"{server} mamba", **_marks(mamba[server]))
    ax.set_ylim(0, 105)
    ax.set_ylabel("pool usage (%)")
    ax.set_title("KV cache (solid) and mamba state pool (dashed) usage")


def _epoch_spans(samples: list[Sample]) -> dict[int, tuple[float, float]]:
    spans: dict[int, tuple[float, float]] = {}
    for s in samples:
        lo, hi = spans.get(s.epoch, (s.t, s.t))
        spans[s.epoch] = (min(lo, s.t), max(hi, s.t))
    return spans


def write_report(output: Path, summary: RunSummary | dict[str, Any], samples: list[Sample],
                 cycles: list[dict[str, Any]], time_scale: float,
                 caps_by_epoch: dict[int, dict[str, int]] | None = None) -> tuple[Path, str]:
    """Write report.md, report.png and summary.json (the summary's fields, for scripts: this
    run's, replaced by the next run's); return the markdown path and the artifact text (the
    same markdown with the picture embedded)."""
    clock = ("wall clock" if time_scale == 1
             else f"modeled GPU time = wall-clock rate ÷ {time_scale:g}")
    if not isinstance(summary, RunSummary):
        summary = RunSummary.model_validate(summary)
    (output / "summary.json").write_text(summary.model_dump_json(indent=1) + "\n")
    png = plot_png(samples, caps_by_epoch or {}, time_scale, summary.seconds, clock)
    (output / "report.png").write_bytes(png)
    body = _markdown(summary, cycles)
    image = "![throughput, running vs cap and pool usage over the run]"
    path = output / "report.md"
    path.write_text(body.replace("{image}", f"{image}(report.png)"))
    inline = f"{image}(data:image/png;base64,{base64.b64encode(png).decode()})"
    return path, body.replace("{image}", inline)


def _cycle_row(c: dict[str, Any]) -> str:
    """One tuning cycle: a canary's verdict with its measured gain, or a fleet restart."""
    measured, predicted = (c.get(k) for k in ("measured_tok_s_per_gpu",
                                              "predicted_tok_s_per_gpu"))
    canary = c.get("canary")
    if canary:
        gain = canary.get("measured_gain")
        how = f"canary on {', '.join(canary['canary_servers'])}"
        verdict = canary["outcome"].replace("_", " ") + (f", {gain:.2f}× measured" if gain
                                                          else "")
    elif c.get("kind") == "restart-one":
        how, verdict = "one server restarted alone", "same config"
    elif c.get("kind") == "relaunch":
        how, verdict = "a dead server relaunched alone", "same config"
    else:
        how, verdict = "whole fleet restarted", "-"
    return (f"| {c['epoch']} | {c['diagnosis']} | {f'{measured:,.0f}' if measured else '-'} | "
            f"{f'{predicted:,.0f}' if predicted else '-'} | {how} | {verdict} | "
            f"{c['reason']} |")


def _markdown(summary: RunSummary, cycles: list[dict[str, Any]]) -> str:
    lines = ["# expansion run report", "", *(f"- {line}" for line in summary_lines(summary)),
             "", "{image}", ""]
    if cycles:
        lines += ["## Tuning cycles", "", "| epoch | diagnosis | measured tok/s/GPU | predicted "
                  "for the candidate | how | verdict | reason |", "|---|---|---|---|---|---|---|"]
        lines += [_cycle_row(c) for c in cycles]
        lines.append("")
    lines += ["## Servers", "", "| server | max_running_requests | max_total_num_tokens | "
              "mamba slots |", "|---|---|---|---|"]
    for srv in summary.servers:
        lines.append(f"| {srv.url} | {srv.max_running_requests} | "
                     f"{srv.max_total_num_tokens} | {srv.max_mamba_cache_size} |")
    return "\n".join(lines) + "\n"
