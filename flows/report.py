"""The end-of-run report: a markdown summary and an SVG plot of throughput and pool usage.

Both are written next to the output (`report.md`, `report.svg`); the flow also publishes the
markdown as a Prefect artifact. The plot is drawn by hand (a few SVG polylines) to avoid a
plotting dependency for one chart.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from tasks.monitor import Sample

WIDTH, HEIGHT, PAD = 720, 260, 40


def fleet_series(samples: list[Sample], time_scale: float, bucket_s: float = 0.0,
                 ) -> list[tuple[float, float, float | None, float | None]]:
    """(t, fleet tok/s in modeled time, mean KV usage, mean mamba usage) per sampling tick."""
    by_t: dict[float, list[Sample]] = {}
    for s in samples:
        by_t.setdefault(round(s.t, 1), []).append(s)
    times = sorted(by_t)
    out = []
    last: dict[str, tuple[float, float]] = {}
    for t in times:
        tok = 0.0
        for s in by_t[t]:
            if s.generation_tokens_total is None:
                continue
            prev = last.get(s.server)
            if prev is not None and t > prev[0] and s.generation_tokens_total >= prev[1]:
                tok += (s.generation_tokens_total - prev[1]) / (t - prev[0]) / time_scale
            last[s.server] = (t, s.generation_tokens_total)
        kv = [s.kv_usage for s in by_t[t] if s.kv_usage is not None]
        mamba = [s.mamba_usage for s in by_t[t] if s.mamba_usage is not None]
        out.append((t, tok, statistics.fmean(kv) if kv else None,
                    statistics.fmean(mamba) if mamba else None))
    return out


def _polyline(points: list[tuple[float, float]], color: str) -> str:
    pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
    return f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{pts}"/>'


def svg_plot(series: list[tuple[float, float, float | None, float | None]]) -> str:
    if not series:
        return f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}"/>'
    t_max = max(p[0] for p in series) or 1.0
    tok_max = max(p[1] for p in series) or 1.0

    def x(t: float) -> float:
        return PAD + (WIDTH - 2 * PAD) * t / t_max

    def y(frac: float) -> float:
        return HEIGHT - PAD - (HEIGHT - 2 * PAD) * frac

    lines = [_polyline([(x(t), y(tok / tok_max)) for t, tok, _, _ in series], "#1f77b4"),
             _polyline([(x(t), y(kv)) for t, _, kv, _ in series if kv is not None], "#2ca02c"),
             _polyline([(x(t), y(m)) for t, _, _, m in series if m is not None], "#d62728")]
    legend = (f'<text x="{PAD}" y="20" font-size="12">tok/s (blue, max {tok_max:,.0f}), '
              'KV usage (green), mamba usage (red); x: wall seconds '
              f'0–{t_max:,.0f}</text>')
    axes = (f'<line x1="{PAD}" y1="{HEIGHT - PAD}" x2="{WIDTH - PAD}" y2="{HEIGHT - PAD}" '
            f'stroke="#888"/><line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{HEIGHT - PAD}" '
            'stroke="#888"/>')
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}">'
            f'{axes}{legend}{"".join(lines)}</svg>')


def write_report(output: Path, summary: dict[str, Any], samples: list[Sample],
                 cycles: list[dict[str, Any]], time_scale: float) -> Path:
    series = fleet_series(samples, time_scale)
    (output / "report.svg").write_text(svg_plot(series))
    lines = [
        "# expansion run report", "",
        f"- output: `{summary['output']}`",
        f"- prompts: {summary['prompts_done_this_run']} this run, "
        f"{summary['already_committed']} committed before, {summary['errors_this_run']} "
        f"errors, {summary['prompts_total']} planned",
        f"- output tokens: {summary['output_tokens']:,} in {summary['seconds']} s "
        f"({summary['tok_s_modeled_gpu_time']:,} tok/s in modeled GPU time)",
        f"- restarts: {summary['restarts']}",
    ]
    if summary.get("capacity_note"):
        lines.append(f"- capacity: {summary['capacity_note']}")
    lines += ["", "![throughput and pool usage](report.svg)", ""]
    if cycles:
        lines += ["## Restarts", "", "| epoch | measured tok/s/GPU | diagnosis | reason |",
                  "|---|---|---|---|"]
        for c in cycles:
            measured = c.get("measured_tok_s_per_gpu")
            shown = f"{measured:,.0f}" if measured else "-"
            lines.append(f"| {c['epoch']} | {shown} | {c['diagnosis']} | {c['reason']} |")
        lines.append("")
    lines += ["## Servers", "", "| server | max_running_requests | max_total_num_tokens | "
              "mamba slots |", "|---|---|---|---|"]
    for s in summary["servers"]:
        lines.append(f"| {s['url']} | {s['max_running_requests']} | "
                     f"{s['max_total_num_tokens']} | {s['max_mamba_cache_size']} |")
    path = output / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path
