"""`expansion`: run the generate flow ad hoc, plan server memory, inspect outputs and logs.

Prefect is imported lazily so `expansion plan --help` and friends stay fast.
"""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from infra.prefect_env import configure_local_prefect

app = typer.Typer(
    help="Huge offline generation jobs on SGLang fleets, as a restartable Prefect flow.",
    no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
console = Console() if sys.stdout.isatty() else Console(width=160)
err = Console(stderr=True) if sys.stderr.isatty() else Console(stderr=True, width=1000)


def _fail(message: str, code: int = 2) -> None:
    err.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def _parse_sets(pairs: list[str]) -> dict[str, Any]:
    from infra.settings import NULL

    out: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            _fail(f"--set {pair!r}: expected KEY=VALUE, e.g. --set server.mem_fraction_static=0.9")
        key, raw = pair.split("=", 1)
        try:
            value: Any = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        out[key.strip()] = NULL if value is None else value
    return out


def _gpus(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        _fail(f"--gpus {text!r}: expected GPU indices like 0,1,2")
    return None


@app.command()
def run(
    prompts: Annotated[Path | None, typer.Option(help="JSONL/Parquet with id + prompt "
                                                 "(or messages). Default: bundled sample.")] = None,
    output: Annotated[str | None, typer.Option(help="Output folder (resumes if it exists).")]
    = None,
    engine: Annotated[str | None, typer.Option(help="sim (simulated fleet) or sglang.")] = None,
    gpus: Annotated[str | None, typer.Option(help="GPU indices, one server each: 0,1,...")]
    = None,
    model: Annotated[str | None, typer.Option(help="Model path or HF id.")] = None,
    config: Annotated[Path | None, typer.Option(help="TOML settings file.")] = None,
    mem_fraction_static: Annotated[float | None, typer.Option(
        "--mem-fraction-static", help="SGLang --mem-fraction-static.")] = None,
    max_running_requests: Annotated[int | None, typer.Option(
        "--max-running-requests", help="SGLang --max-running-requests.")] = None,
    mamba_strategy: Annotated[str | None, typer.Option(
        "--mamba-radix-cache-strategy", "--mamba-scheduler-strategy", "--mamba-strategy",
        help="SGLang's --mamba-radix-cache-strategy (old name --mamba-scheduler-strategy): "
        "auto|no_buffer|extra_buffer|extra_buffer_lazy.")] = None,
    max_mamba_cache_size: Annotated[int | None, typer.Option(
        "--max-mamba-cache-size", help="SGLang --max-mamba-cache-size.")] = None,
    mamba_full_memory_ratio: Annotated[float | None, typer.Option(
        "--mamba-full-memory-ratio", help="SGLang --mamba-full-memory-ratio.")] = None,
    concurrency: Annotated[int | None, typer.Option(
        help="Client in-flight requests per server (default: server cap + queue_target).")]
    = None,
    shard_size: Annotated[int | None, typer.Option(help="Prompts per output shard.")] = None,
    max_new_tokens: Annotated[int | None, typer.Option(help="Default max_new_tokens.")] = None,
    upload_to: Annotated[str | None, typer.Option(help="Copy committed shards here.")] = None,
    time_scale: Annotated[float | None, typer.Option(
        help="engine=sim: modeled GPU seconds per wall second.")] = None,
    set_: Annotated[list[str] | None, typer.Option(
        "--set", help="Any setting as KEY=VALUE (dotted, e.g. client.max_attempts=3); "
        "see `expansion settings`.")] = None,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Print each server's launch command and start nothing.")] = False,
) -> None:
    """Run the `generate` flow now (ad hoc), on a simulated or real SGLang fleet."""
    overrides = _parse_sets(set_ or [])
    shortcuts = {
        "server.mem_fraction_static": mem_fraction_static,
        "server.max_running_requests": max_running_requests,
        "server.mamba_strategy": mamba_strategy,
        "server.max_mamba_cache_size": max_mamba_cache_size,
        "server.mamba_full_memory_ratio": mamba_full_memory_ratio,
        "client.concurrency_per_server": concurrency,
        "shard_size": shard_size,
        "sampling.max_new_tokens": max_new_tokens,
        "upload_to": upload_to,
        "sim.time_scale": time_scale,
        "prompts": str(prompts) if prompts else None, "output": output, "engine": engine,
        "gpus": _gpus(gpus), "model": model,
    }
    # A named option wins over `--set` of the same field (both are on the command line).
    overrides.update({k: v for k, v in shortcuts.items() if v is not None})
    config_file = str(config) if config else None
    from infra.settings import NULL, SettingsError, load_settings

    try:
        settings = load_settings(config_file, **overrides)
    except SettingsError as exc:
        _fail(str(exc))
        return
    if dry_run:
        _print_launch_commands(settings)
        return
    from flows.generate import preflight

    try:
        warnings = preflight(settings)  # fast, before Prefect starts and before any output
    except ValueError as exc:
        _fail(str(exc))
        return
    for warning in warnings:
        err.print(f"[bold yellow]warning:[/] {warning}", highlight=False, soft_wrap=True)
    configure_local_prefect()
    from prefect import tags

    from flows.generate import generate
    from infra.ledger import PlanMismatch
    from infra.prefect_runs import crash_vanished_runs, process_tag
    from infra.prompts import InputError
    from tasks.health import ServerStartFailed
    from tasks.servers import LaunchError

    for name in crash_vanished_runs():
        err.print(f"note: flow run {name!r} was Running but its process is gone; marked "
                  "Crashed", highlight=False, soft_wrap=True)
    try:
        with _manifest_progress(settings.local_output()), tags(process_tag()):
            # The flow's own parameters show in the Prefect UI; the rest are overrides.
            top = {k: overrides.pop(k) for k in ("prompts", "output", "engine", "gpus", "model")
                   if k in overrides}
            # A flow parameter is JSON: an explicit null travels as None (job_settings).
            params = {k: (None if v is NULL else v) for k, v in overrides.items()}
            summary = generate(**top, config_file=config_file, overrides=params)
    except (InputError, PlanMismatch, LaunchError, ServerStartFailed, ValueError) as exc:
        _fail(str(exc), code=1)
        return
    _print_summary(summary)


@contextlib.contextmanager
def _manifest_progress(output: Path) -> Iterator[None]:
    """A rich progress bar fed by the manifest (the same truth `expansion status` reads)."""
    import threading

    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from infra.ledger import Ledger

    done = threading.Event()
    ledger = Ledger(output)

    def watch(progress: Progress) -> None:
        task_id = None
        t0, tokens0 = time.monotonic(), None
        while not done.wait(0.5):
            try:
                plan = ledger.load_plan()
                committed = ledger.committed()
            except (FileNotFoundError, ValueError, TypeError):
                continue
            tokens = sum(e.output_tokens for e in committed.values())
            tokens0 = tokens if tokens0 is None else tokens0
            rate = (tokens - tokens0) / max(time.monotonic() - t0, 1e-9)
            if task_id is None:
                task_id = progress.add_task("shards", total=plan.num_shards)
            progress.update(task_id, completed=len(committed),
                            description=f"shards · {rate:,.0f} tok/s")

    if not sys.stderr.isatty():
        yield
        return
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), TimeRemainingColumn(), console=err,
                  transient=True) as progress:
        thread = threading.Thread(target=watch, args=(progress,), daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join(timeout=2)


def _print_launch_commands(settings: Any) -> None:
    from tasks.servers import LaunchError, build_launch_specs

    try:
        specs = build_launch_specs(settings, settings.local_output())
    except (ValueError, LaunchError) as exc:
        _fail(str(exc))
        return
    from infra.processes import ephemeral_port_warning

    warning = ephemeral_port_warning([s.port for s in specs])
    if warning:
        err.print(f"[bold yellow]warning:[/] {warning}", highlight=False, soft_wrap=True)
    for spec in specs:
        print(spec.shell_line())


def _print_summary(summary: dict[str, Any]) -> None:
    table = Table(show_edge=False)
    for col in ("server", "max_running_requests", "max_total_num_tokens", "mamba slots"):
        table.add_column(col, overflow="fold")
    for srv in summary["servers"]:
        table.add_row(srv["url"].removeprefix("http://"), str(srv["max_running_requests"]),
                      str(srv["max_total_num_tokens"]), str(srv["max_mamba_cache_size"]))
    from flows.summary import format_summary

    console.print(format_summary(summary), highlight=False, soft_wrap=True)
    if summary["servers"]:
        console.print(table)


@app.command()
def settings() -> None:
    """List every setting with its default; set them via TOML, EXPANSION_* env or --set."""
    from infra.settings import settings_fields

    table = Table(show_edge=False)
    table.add_column("setting")
    table.add_column("env var")
    table.add_column("default")
    table.add_column("meaning")
    for name, default, doc in settings_fields():
        env = "EXPANSION_" + name.upper().replace(".", "__")
        table.add_row(name, env, default, doc)
    console.print(table)


@app.command()
def status(output: Annotated[Path, typer.Argument(help="An output folder.")]) -> None:
    """Progress of a job from its manifest (no server needed)."""
    from infra.ledger import Ledger

    ledger = Ledger(output)
    try:
        plan = ledger.load_plan()
    except FileNotFoundError as exc:
        _fail(str(exc))
        return
    committed = ledger.committed()
    rows = sum(e.rows for e in committed.values())
    errors = sum(e.errors for e in committed.values())
    tokens = sum(e.output_tokens for e in committed.values())
    console.print(f"plan {plan.fingerprint}: {len(committed)}/{plan.num_shards} shards "
                  f"committed; {rows} completions, {errors} errors, of {plan.input_rows} "
                  f"prompts; {tokens} output tokens")


@app.command()
def sim(
    gpus: Annotated[str, typer.Option(help="One simulated server per index.")] = "0,1",
    model: Annotated[str, typer.Option(help="Model profile.")] = "Qwen/Qwen3.6-27B",
    base_port: Annotated[int, typer.Option(help="First port.")] = 30000,
    output: Annotated[Path, typer.Option(help="Where logs go.")] = Path("expansion-sim"),
    set_: Annotated[list[str] | None, typer.Option("--set", help="KEY=VALUE settings.")]
    = None,
) -> None:
    """Start a simulated SGLang fleet for manual use; print its URLs; Ctrl-C stops it."""
    from infra.settings import SettingsError, load_settings
    from tasks.health import ServerStartFailed, wait_until_healthy
    from tasks.servers import build_launch_specs, launch_fleet, registry_for, stop_fleet

    try:
        settings = load_settings(None, engine="sim", gpus=_gpus(gpus), model=model,
                                 base_port=base_port, **_parse_sets(set_ or []))
    except SettingsError as exc:
        _fail(str(exc))
        return
    out = output.resolve()
    specs = build_launch_specs(settings, out)
    handles = launch_fleet(specs, registry_for(out), settings.server.fingerprint())
    stopping = False

    def _stop(*_: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, _stop)
    try:
        wait_until_healthy(handles, None, settings.startup_timeout_s)
        for h in handles:
            console.print(f"{h.url}  (GPU {h.gpu}, log {h.log_path})")
        console.print("Ctrl-C to stop.")
        while not stopping:
            time.sleep(0.5)
    except ServerStartFailed as exc:
        err.print(str(exc))
    except KeyboardInterrupt:
        pass
    finally:
        stop_fleet(handles, registry_for(out), settings.stop_grace_s)


@app.command()
def plan(
    model: Annotated[str, typer.Option(help="Built-in profile (e.g. Qwen/Qwen3.6-27B, "
                                       "qwen3-next-80b-a3b, qwen3-32b) or a HF config.json.")]
    = "Qwen/Qwen3.6-27B",
    gpu: Annotated[str, typer.Option(help="b200, rtx-pro-6000, h200, h100.")] = "rtx-pro-6000",
    sglang_version: Annotated[str, typer.Option("--sglang-version",
                                                help="SGLang release (or 'main').")] = "0.5.23",
    mem_fraction_static: Annotated[float | None, typer.Option("--mem-fraction-static")] = None,
    max_running_requests: Annotated[int | None, typer.Option("--max-running-requests")] = None,
    max_total_tokens: Annotated[int | None, typer.Option("--max-total-tokens")] = None,
    mamba_strategy: Annotated[str, typer.Option(
        "--mamba-radix-cache-strategy", "--mamba-scheduler-strategy",
        help="auto|no_buffer|extra_buffer|extra_buffer_lazy.")] = "auto",
    max_mamba_cache_size: Annotated[int | None, typer.Option("--max-mamba-cache-size")] = None,
    mamba_full_memory_ratio: Annotated[float | None, typer.Option(
        "--mamba-full-memory-ratio")] = None,
    mamba_ssm_dtype: Annotated[str | None, typer.Option("--mamba-ssm-dtype")] = None,
    disable_overlap_schedule: Annotated[bool, typer.Option("--disable-overlap-schedule")]
    = False,
    disable_radix_cache: Annotated[bool, typer.Option("--disable-radix-cache")] = False,
    speculative_algorithm: Annotated[str | None, typer.Option("--speculative-algorithm")]
    = None,
    speculative_num_steps: Annotated[int | None, typer.Option("--speculative-num-steps")]
    = None,
    speculative_eagle_topk: Annotated[int | None, typer.Option("--speculative-eagle-topk")]
    = None,
    speculative_num_draft_tokens: Annotated[int | None, typer.Option(
        "--speculative-num-draft-tokens")] = None,
    kv_cache_dtype: Annotated[str, typer.Option("--kv-cache-dtype")] = "auto",
    tp_size: Annotated[int, typer.Option("--tp-size")] = 1,
    context_length: Annotated[int | None, typer.Option("--context-length")] = None,
    page_size: Annotated[int | None, typer.Option("--page-size")] = None,
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
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Predict SGLang's pools and caps for a model × GPU × flags, and the alternatives."""
    from pydantic import ValidationError

    from infra.sglang.flags import ServerFlags
    from infra.sglang.planner import alternatives
    from infra.sglang.profiles import gpu_profile, model_profile
    from infra.sglang.versions import parse_version

    try:
        flags = ServerFlags.model_validate({
            "mem_fraction_static": mem_fraction_static,
            "max_running_requests": max_running_requests, "max_total_tokens": max_total_tokens,
            "mamba_strategy": mamba_strategy, "max_mamba_cache_size": max_mamba_cache_size,
            "mamba_full_memory_ratio": mamba_full_memory_ratio,
            "mamba_ssm_dtype": mamba_ssm_dtype,
            "disable_overlap_schedule": disable_overlap_schedule,
            "disable_radix_cache": disable_radix_cache,
            "speculative_algorithm": speculative_algorithm,
            "speculative_num_steps": speculative_num_steps,
            "speculative_eagle_topk": speculative_eagle_topk,
            "speculative_num_draft_tokens": speculative_num_draft_tokens,
            "kv_cache_dtype": kv_cache_dtype, "tp_size": tp_size,
            "context_length": context_length, "page_size": page_size})
        prof = model_profile(model, weights_gib)
        card = gpu_profile(gpu)
        version = parse_version(sglang_version)
    except ValidationError as exc:
        first = exc.errors()[0]
        _fail(f"--{str(first['loc'][0]).replace('_', '-') if first['loc'] else 'flags'}: "
              f"{first['msg'].removeprefix('Value error, ')} (got {first.get('input')!r})")
        return
    except ValueError as exc:
        _fail(str(exc))
        return
    rows = alternatives(prof, card, flags, version, avg_context)
    current = rows[0]
    estimate = None
    if job is not None:
        rate = tok_s_per_gpu or current.tok_s_per_gpu
        if not rate:
            _fail("--job: no throughput to estimate from; pass --tok-s-per-gpu")
            return
        estimate = job_estimate(job, avg_output_tokens, num_gpus, rate)
    if as_json:
        payload: dict[str, Any] = {"model": prof.name, "gpu": card.name,
                                   "version": version.label}
        if current.plan is None:
            payload["error"] = current.error
        else:
            payload.update(current.plan.to_dict())
            payload["tok_s_per_gpu"] = round(current.tok_s_per_gpu or 0.0, 1)
        if estimate is not None:
            payload["job"] = estimate
        payload["alternatives"] = [
            {"label": r.label, "error": r.error,
             "mamba_slots": r.plan.mamba_slots if r.plan else None,
             "max_running_requests": r.plan.max_running_requests if r.plan else None,
             "max_total_num_tokens": r.plan.max_total_num_tokens if r.plan else None,
             "binding_limit": r.plan.binding_limit if r.plan else None,
             "tok_s_per_gpu": round(r.tok_s_per_gpu, 1) if r.tok_s_per_gpu else None}
            for r in rows[1:]]
        print(json.dumps(payload))
        if current.plan is None:
            raise typer.Exit(1)
        return
    if current.plan is None:
        _fail(f"SGLang would refuse to start: {current.error}", code=1)
        return
    _print_plan(current.plan)
    table = Table(show_edge=False, title="alternatives (one lever each)")
    for col in ("change", "strategy", "mamba slots", "max_running_requests", "KV tokens",
                "binds", "tok/s/GPU"):
        table.add_column(col, overflow="fold")
    for r in rows:
        if r.plan is None:
            table.add_row(r.label, "-", "-", "-", "-", "refused", (r.error or "")[:60])
            continue
        table.add_row(r.label, r.plan.mamba_strategy, str(r.plan.mamba_slots or "-"),
                      str(r.plan.max_running_requests), str(r.plan.max_total_num_tokens),
                      r.plan.binding_limit, f"{r.tok_s_per_gpu:,.0f}")
    console.print(table)
    if estimate is not None:
        console.print(
            f"job: {job:,} prompts × {avg_output_tokens:,.0f} tokens on {num_gpus} GPUs at "
            f"{estimate['tok_s_per_gpu']:,.0f} tok/s per GPU → {estimate['wall_hours']:,.1f} h "
            f"wall, {estimate['gpu_hours']:,.0f} GPU-hours")


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
        _fail(f"{path}: cannot read: {exc.strerror}")
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
    caps = [r for r in records if r["kind"] in ("startup", "server_info")]
    merged: dict[str, Any] = {}
    for r in caps:
        merged.update({k: v for k, v in r.items() if v is not None and k != "kind"})
    keys = ("max_total_num_tokens", "max_running_requests", "max_mamba_cache_size",
            "context_len", "version")
    if any(k in merged for k in keys):
        console.print("capacity: " + ", ".join(f"{k}={merged[k]}" for k in keys if k in merged))
    last = next((r for r in reversed(records) if r["kind"] in ("decode", "metrics")), None)
    if last is not None:
        shown = {k: v for k, v in last.items() if v is not None and k not in ("kind",)}
        console.print(f"last {last['kind']}: " + ", ".join(f"{k}={v}" for k, v in shown.items()))


@app.command("setup-prefect")
def setup_prefect(
    timeout_s: Annotated[float, typer.Option(help="How long to wait for the API.")] = 120,
) -> None:
    """Wait for the Prefect API, then create the work pools deployments/prefect.yaml uses.

    Run after `prefect server start --background` and before `prefect deploy`."""
    configure_local_prefect()
    from prefect.settings import PREFECT_API_URL

    from infra.prefect_setup import PrefectSetupError, ensure_pools, pools_named, wait_for_api

    api_url = PREFECT_API_URL.value()
    if not api_url:
        _fail("PREFECT_API_URL: not set; export PREFECT_API_URL=http://127.0.0.1:4200/api "
              "(or your Prefect server's /api URL) first")
        return
    try:
        took = wait_for_api(api_url, timeout_s)
        pools = ensure_pools(pools_named())
    except PrefectSetupError as exc:
        _fail(str(exc))
        return
    console.print(f"Prefect API at {api_url} answered after {took:.1f} s; work pools: "
                  + ", ".join(f"{name} ({how})" for name, how in pools))


@app.command("install-automation")
def install_automation(
    heartbeat_s: Annotated[float, typer.Option(
        help="PREFECT_FLOWS_HEARTBEAT_FREQUENCY of the workers (the deployment sets 60).")] = 60,
    window_s: Annotated[float | None, typer.Option(
        help="Crash a run after this long without a heartbeat (default 3 × heartbeat).")] = None,
) -> None:
    """Install (or update) the Prefect automation that marks vanished flow runs Crashed.

    Run once per Prefect server; without it a node that loses power stays Running forever."""
    configure_local_prefect()
    from prefect.settings import PREFECT_API_URL

    from infra.prefect_automations import install_zombie_automation

    if not PREFECT_API_URL.value():
        err.print("[bold yellow]warning:[/] PREFECT_API_URL is not set: the automation goes "
                  "to this machine's ephemeral Prefect database, which no worker uses; set "
                  "PREFECT_API_URL to your Prefect server", highlight=False, soft_wrap=True)

    try:
        action, automation = install_zombie_automation(heartbeat_s, window_s)
    except ValueError as exc:
        _fail(str(exc))
        return
    console.print(f"{action} automation {automation.name!r} ({automation.id})")


@app.command()
def export(
    output: Annotated[Path, typer.Argument(help="An output folder.")],
    to: Annotated[Path, typer.Option("--to", help="File to write (JSONL).")],
    model: Annotated[str, typer.Option(help="Model name to put in each response.")] = "model",
) -> None:
    """Export completions as OpenAI batch output JSONL, keyed by custom_id (= input id)."""
    from infra.export import export_openai_batch

    if not (output / "plan.json").is_file():
        _fail(f"{output} has no plan.json: not an expansion output folder")
    count = export_openai_batch(output, to, model)
    console.print(f"wrote {count} lines to {to}")


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
    from tasks.monitor import Sample, sample_server
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
            _fail(f"{log}: cannot read: {exc.strerror}")
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
        names = {f"server-{i}": u.rstrip("/") for i, u in enumerate(urls)}
        for name, url in names.items():
            try:
                info = parse_server_info(get_server_info(url, api_key))
            except (ServerAnswerError, OSError) as exc:
                err.print(f"{url}: {exc}")
                continue
            if info.max_running_requests:
                caps[name] = info.max_running_requests
            pools = pools or pools_from_caps(info.max_running_requests,
                                             info.max_mamba_cache_size, info.mamba_strategy)
        t0 = time.monotonic()
        while time.monotonic() - t0 < seconds:
            samples += [sample_server(n, u, api_key, time.monotonic() - t0, 1)
                        for n, u in names.items()]
            time.sleep(1.0)
    else:
        _fail("give server URLs or --log FILE")
        return
    result = run_diagnosis(window_stats(samples, since, 1.0), caps, pools)
    console.print(f"[bold]{result.kind}[/]: {result.evidence}")
    for w in result.servers:
        console.print(f"  {w.server}: {w.tok_s:,.0f} tok/s, running {w.running:.1f}, "
                      f"queue {w.queued:.1f}, KV {_pct_or_na(w.kv_usage)}, "
                      f"mamba {_pct_or_na(w.mamba_usage)}")


def _pct_or_na(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0%}"


def job_estimate(prompts: int, avg_output_tokens: float, gpus: int,
                 tok_s_per_gpu: float) -> dict[str, float]:
    """Wall time and GPU-hours of a job at a steady per-GPU throughput (no restarts)."""
    tokens = prompts * avg_output_tokens
    wall_h = tokens / (gpus * tok_s_per_gpu) / 3600
    return {"prompts": prompts, "output_tokens": tokens, "gpus": gpus,
            "tok_s_per_gpu": round(tok_s_per_gpu, 1), "wall_hours": round(wall_h, 2),
            "gpu_hours": round(wall_h * gpus, 1)}


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


def main() -> None:
    try:
        app()
    except BrokenPipeError:
        sys.exit(0)


if __name__ == "__main__":
    main()
