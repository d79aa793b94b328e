"""`expansion plan`, `inspect`, `diagnose`: what SGLang will allocate, what a file or a live
server says."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from expansion.cli_common import app, console, err, fail


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def plan(
    ctx: typer.Context,
    model: Annotated[str, typer.Option(help="Built-in profile (e.g. Qwen/Qwen3.6-27B, "
                                       "qwen3-next-80b-a3b, qwen3-32b) or a HF config.json.")]
    = "Qwen/Qwen3.6-27B",
    gpu: Annotated[str, typer.Option(help="b200, rtx-pro-6000, h200, h100.")] = "rtx-pro-6000",
    sglang_version: Annotated[str, typer.Option("--sglang-version",
                                                help="SGLang release (or 'main').")] = "0.5.23",
    weights_gib: Annotated[float | None, typer.Option(
        "--weights-gib", help="Weights per GPU at TP1 (for a config.json without index).")]
    = None,
    avg_context: Annotated[float, typer.Option(
        help="Average tokens in context per running request, for tok/s.")] = 2048.0,
    job: Annotated[int | None, typer.Option(
        "--job", help="Estimate wall time and GPU-hours for this many prompts.")] = None,
    avg_output_tokens: Annotated[float, typer.Option(
        help="Average completion length, for --job.")] = 1024.0,
    num_gpus: Annotated[int, typer.Option("--num-gpus", help="GPUs (servers), for --job.")]
    = 8,
    tok_s_per_gpu: Annotated[float | None, typer.Option(
        help="Measured tok/s per GPU, for --job (default: the model's prediction).")] = None,
    prompt_tokens: Annotated[int | None, typer.Option(
        "--prompt-tokens", min=1, help="Prompt length of the job's rows: with --output-tokens, "
        "predict committed tok/s (prefill, waves and retractions included).")] = None,
    output_tokens: Annotated[int | None, typer.Option(
        "--output-tokens", min=1, help="Mean output length of the job's rows.")] = None,
    output_p99: Annotated[int | None, typer.Option(
        "--output-p99", min=2, help="99th percentile of output lengths (lognormal); "
        "default: every output --output-tokens long.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Predict SGLang's pools and caps for a model × GPU × flags, and the alternatives.

    Server flags are SGLang's own, as on its command line (--mem-fraction-static 0.9
    --mamba-radix-cache-strategy no_buffer ...): every flag the release accepts; those the
    model reads (server.* in `expansion settings`) are planned, the others carried."""
    from pydantic import ValidationError

    from infra.sglang.flag_parser import parse_server_flags
    from infra.sglang.planner import alternatives
    from infra.sglang.profiles import gpu_profile, model_profile
    from infra.sglang.versions import parse_version
    from infra.sim.replay_worker import WORKER

    WORKER.in_process = True  # this process serves nothing a replay could stall
    try:
        version = parse_version(sglang_version)
        flags = parse_server_flags(list(ctx.args), version)
        prof = model_profile(model, weights_gib)
        card = gpu_profile(gpu)
        workload = _workload(prompt_tokens, output_tokens, output_p99)
    except ValidationError as exc:
        first = exc.errors()[0]
        fail(f"--{str(first['loc'][0]).replace('_', '-') if first['loc'] else 'flags'}: "
              f"{first['msg'].removeprefix('Value error, ')} (got {first.get('input')!r})")
        return
    except ValueError as exc:
        fail(str(exc))
        return
    rows = alternatives(prof, card, flags, version, avg_context, workload)
    current = rows[0]
    estimate = None
    if job is not None:
        rate = tok_s_per_gpu or current.tok_s_per_gpu
        if not rate:
            fail("--job: no throughput to estimate from; pass --tok-s-per-gpu")
            return
        estimate = job_estimate(job, avg_output_tokens, num_gpus, rate)
    if _show(rows, estimate, (prof, card, version, flags), as_json) and estimate is not None:
        console.print(
            f"job: {job:,} prompts × {avg_output_tokens:,.0f} tokens on {num_gpus} GPUs at "
            f"{estimate['tok_s_per_gpu']:,.0f} tok/s per GPU → {estimate['wall_hours']:,.1f} h "
            f"wall, {estimate['gpu_hours']:,.0f} GPU-hours")


def _show(rows: list[Any], estimate: dict[str, Any] | None, what: tuple[Any, Any, Any, Any],
          as_json: bool) -> bool:
    """Print the plan (or its JSON), the alternatives and how sure it is; False when SGLang
    would refuse the current flags (or the JSON said it all)."""
    from infra.sglang.calibration_note import calibration_note
    from infra.sglang.strategy import launch_needs

    prof, card, version, flags = what
    current = rows[0]
    note = calibration_note(card, prof, flags, version)
    if as_json:
        _print_plan_json(prof.name, card.name, version.label, rows, estimate,
                         (note, launch_needs(prof, flags, version)))
        return False
    if current.plan is None:
        fail(f"SGLang would refuse to start: {current.error}", code=1)
        return False
    _print_plan(current.plan)
    _print_alternatives(rows)
    console.print(("" if note.calibrated else "[yellow]") + note.describe())
    _print_unmodelled(flags)
    for need in launch_needs(prof, flags, version):
        console.print(f"[yellow]a launch line of your own needs {need}; `expansion run` adds it")
    return True


def _workload(prompt: int | None, output: int | None, p99: int | None) -> Any:
    """The workload to predict committed tok/s for, or None (decode rate only)."""
    from infra.sim.predict import Workload

    if prompt is None and output is None:
        if p99 is not None:
            raise ValueError("--output-p99 needs --prompt-tokens and --output-tokens")
        return None
    if prompt is None or output is None:
        raise ValueError("--prompt-tokens and --output-tokens go together: give both")
    return Workload(prompt, output, p99)


def _print_plan(p: Any) -> None:
    console.print(f"[bold]{p.model}[/] on {p.gpu}, SGLang {p.version}: mem_fraction_static "
                  f"{p.mem_fraction_static}, {p.weights_gib} GiB weights, "
                  f"{p.rest_gib} GiB for pools")
    if p.mamba_slots:
        console.print(
            f"mamba: {p.mamba_slots} slots × {p.per_slot_mib} MiB ({p.mamba_strategy}, "
            f"{p.slot_ratio} slots per running request) — conv {p.conv_state_gib} GiB, "
            f"ssm {p.ssm_state_gib} GiB, intermediate {p.intermediate_gib} GiB")
    console.print(f"KV: {p.kv_cache_gib} GiB = {p.max_total_num_tokens} tokens")
    cap = f"mamba {p.mamba_cap}, " if p.mamba_cap is not None else ""
    console.print(f"max_running_requests = {p.max_running_requests} (caps: requested "
                  f"{p.requested_running_requests}, {cap}KV {p.token_cap}) → binds: "
                  f"[bold]{p.binding_limit}[/]")
    for w in p.warnings:
        console.print(f"[yellow]SGLang would log:[/] {w}")


def job_estimate(prompts: int, avg_output_tokens: float, gpus: int,
                 tok_s_per_gpu: float) -> dict[str, float]:
    """Wall time and GPU-hours of a job at a steady per-GPU throughput (no restarts)."""
    tokens = prompts * avg_output_tokens
    wall_h = tokens / (gpus * tok_s_per_gpu) / 3600
    return {"prompts": prompts, "output_tokens": tokens, "gpus": gpus,
            "tok_s_per_gpu": round(tok_s_per_gpu, 1), "wall_hours": round(wall_h, 2),
            "gpu_hours": round(wall_h * gpus, 1)}


def _pct_or_na(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0%}"


@app.command()
def inspect(
    path: Annotated[Path, typer.Argument(help="A server log, a /server_info JSON body or a "
                                         "/metrics dump.")],
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per record.")]
    = False,
) -> None:
    """Detect what a file holds (log, server_info, metrics), parse it, summarize it."""
    from infra.sglang.observe import parse_any

    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        fail(f"{path}: cannot read: {exc.strerror}")
        return
    kind, records = parse_any(text)
    if as_json:
        for record in records:
            print(json.dumps(record))
        return
    counts: dict[str, int] = {}
    for record in records:
        counts[record["kind"]] = counts.get(record["kind"], 0) + 1
    console.print(f"{path}: {kind}, {len(records)} records "
                  f"({', '.join(f'{v} {k}' for k, v in sorted(counts.items())) or 'none'})")
    capacity_records = [r for r in records if r["kind"] in ("startup", "server_info")]
    merged: dict[str, Any] = {}
    for r in capacity_records:
        merged.update({k: v for k, v in r.items() if v is not None and k != "kind"})
    keys = ("max_total_num_tokens", "max_running_requests", "max_mamba_cache_size",
            "context_len", "version")
    if any(k in merged for k in keys):
        console.print("capacity: " + ", ".join(f"{k}={merged[k]}" for k in keys if k in merged))
    last = next((r for r in reversed(records) if r["kind"] in ("decode", "metrics")), None)
    if last is not None:
        shown = {k: v for k, v in last.items() if v is not None and k not in ("kind",)}
        console.print(f"last {last['kind']}: " + ", ".join(f"{k}={v}" for k, v in shown.items()))


@app.command()
def diagnose(
    urls: Annotated[list[str] | None, typer.Argument(help="Live server URLs.")] = None,
    log: Annotated[Path | None, typer.Option("--log", help="A server log instead.")] = None,
    seconds: Annotated[float, typer.Option(help="How long to sample live servers.")] = 10.0,
    api_key: Annotated[str | None, typer.Option(envvar="EXPANSION_API_KEY",
                                                help="The servers' --api-key.")] = None,
) -> None:
    """Why is it slow? mamba-, KV-, client- or compute-bound, unhealthy or asymmetric."""
    from infra.sglang.client import ServerAnswerError, get_server_info
    from infra.sglang.observe import parse_log
    from infra.sglang.server_info import parse_server_info
    from tasks.monitor import Sample, SGLangMetrics, sample_server
    from tasks.tuning.diagnosis import PoolView, pools_from_caps, samples_from_log, window_stats
    from tasks.tuning.diagnosis import diagnose as run_diagnosis

    caps: dict[str, int] = {}
    pools: PoolView | None = None
    samples: list[Sample] = []
    since = 0.0
    if log is not None:
        try:
            records = parse_log(log.read_text(errors="replace"))
        except OSError as exc:
            fail(f"{log}: cannot read: {exc.strerror}")
            return
        samples = samples_from_log(records, log.name)
        startup: dict[str, Any] = {}
        for r in records:
            if r["kind"] == "startup":
                startup.update({k: v for k, v in r.items() if v is not None})
        if startup.get("max_running_requests"):
            caps[log.name] = int(startup["max_running_requests"])
        pools = pools_from_caps(startup.get("max_running_requests"),
                                startup.get("max_mamba_cache_size"), None)
        since = samples[-1].t - max(seconds, 60.0) if samples else 0.0
    elif urls:
        import httpx

        bad = [u for u in urls if not u.startswith(("http://", "https://"))]
        if bad:
            fail(f"{bad[0]}: a server URL needs its scheme: http://{bad[0]}")
        names = {f"server-{i}": u.rstrip("/") for i, u in enumerate(urls)}
        answered = 0
        for name, url in names.items():
            try:
                info = parse_server_info(get_server_info(url, api_key, timeout_s=5.0))
            except (ServerAnswerError, httpx.HTTPError, OSError) as exc:
                err.print(f"{url}: {exc}")
                continue
            answered += 1
            if info.max_running_requests:
                caps[name] = info.max_running_requests
            pools = pools or pools_from_caps(info.max_running_requests,
                                             info.max_mamba_cache_size, info.mamba_strategy)
        if not answered:
            fail(f"no server answered at {', '.join(names.values())}: is it up, and are "
                 "host and port right?")
        t0 = time.monotonic()
        while time.monotonic() - t0 < seconds:
            samples += [sample_server(n, u, api_key, time.monotonic() - t0, 1, SGLangMetrics())
                        for n, u in names.items()]
            time.sleep(1.0)
    else:
        fail("give server URLs or --log FILE")
        return
    result = run_diagnosis(window_stats(samples, since, 1.0), caps, pools)
    console.print(f"[bold]{result.kind}[/]: {result.evidence}")
    for w in result.servers:
        console.print(f"  {w.server}: {w.tok_s:,.0f} tok/s, running {w.running:.1f}, "
                      f"queue {w.queued:.1f}, KV {_pct_or_na(w.kv_usage)}, "
                      f"mamba {_pct_or_na(w.mamba_usage)}")


def _print_unmodelled(flags: Any) -> None:
    from infra.sglang.flag_parser import unmodelled

    if unmodelled(flags):
        console.print("carried to the launch, not modelled: " + ", ".join(unmodelled(flags)))


def _print_plan_json(model: str, gpu: str, version: str, rows: list[Any],
                     estimate: dict[str, Any] | None, notes: tuple[Any, list[str]]) -> None:
    """`plan --json`: one object, the current plan's fields, the job estimate, alternatives;
    `notes`: how sure the step model is, and the flags a launch line of one's own needs."""
    from infra.sglang.flag_parser import unmodelled

    current = rows[0]
    note, needs = notes
    payload: dict[str, Any] = {"model": model, "gpu": gpu, "version": version,
                               "calibration": asdict(note), "unmodelled_flags": unmodelled(
                                   rows[0].flags), "launch_needs": needs}
    if current.plan is None:
        payload["error"] = current.error
    else:
        payload.update(current.plan.to_dict())
        payload["tok_s_per_gpu"] = round(current.tok_s_per_gpu or 0.0, 1)
        payload["committed_tok_s_per_gpu"] = _rounded(current.committed_tok_s_per_gpu)
    if estimate is not None:
        payload["job"] = estimate
    payload["alternatives"] = [
        {"label": r.label, "error": r.error,
         "mamba_slots": r.plan.mamba_slots if r.plan else None,
         "max_running_requests": r.plan.max_running_requests if r.plan else None,
         "max_total_num_tokens": r.plan.max_total_num_tokens if r.plan else None,
         "binding_limit": r.plan.binding_limit if r.plan else None,
         "mamba_strategy": r.plan.mamba_strategy if r.plan else None,
         "graphs_cover_cap": r.plan.graphs_cover_cap if r.plan else None,
         "tok_s_per_gpu": round(r.tok_s_per_gpu, 1) if r.tok_s_per_gpu else None,
         "committed_tok_s_per_gpu": _rounded(r.committed_tok_s_per_gpu)}
        for r in rows[1:]]
    print(json.dumps(payload))
    if current.plan is None:
        raise typer.Exit(1)


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _print_alternatives(rows: list[Any]) -> None:
    committed = rows[0].committed_tok_s_per_gpu is not None
    table = Table(show_edge=False, title="alternatives (one lever each)")
    for col in ("change", "strategy", "mamba slots", "max_running_requests", "KV tokens",
                "binds", "decode tok/s/GPU", *(["committed tok/s/GPU"] if committed else [])):
        table.add_column(col, overflow="fold")
    for r in rows:
        if r.plan is None:
            table.add_row(r.label, "-", "-", "-", "-", "refused", (r.error or "")[:60])
            continue
        extra = [f"{r.committed_tok_s_per_gpu:,.0f}"] if committed else []
        table.add_row(r.label, r.plan.mamba_strategy, str(r.plan.mamba_slots or "-"),
                      str(r.plan.max_running_requests), str(r.plan.max_total_num_tokens),
                      r.plan.binding_limit, f"{r.tok_s_per_gpu:,.0f}", *extra)
    console.print(table)
