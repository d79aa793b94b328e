"""`expansion`: run the generate flow ad hoc, plan server memory, inspect outputs and logs.

Prefect is imported lazily so `expansion plan --help` and friends stay fast.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from infra.prefect_env import configure_local_prefect

app = typer.Typer(
    help="Huge offline generation jobs on SGLang fleets, as a restartable Prefect flow.",
    no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
console = Console()
err = Console(stderr=True)


def _fail(message: str, code: int = 2) -> None:
    err.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def _parse_sets(pairs: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            _fail(f"--set {pair!r}: expected KEY=VALUE, e.g. --set server.mem_fraction_static=0.9")
        key, raw = pair.split("=", 1)
        try:
            value: Any = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        out[key.strip()] = value
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
        "--mamba-strategy", help="auto|no_buffer|extra_buffer|extra_buffer_lazy.")] = None,
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
    }
    overrides.update({k: v for k, v in shortcuts.items() if v is not None})
    gpu_list = _gpus(gpus)
    config_file = str(config) if config else None
    prompts_path = str(prompts) if prompts else None
    from flows.settings import SettingsError, load_settings

    try:
        settings = load_settings(config_file, prompts=prompts_path, output=output,
                                 engine=engine, gpus=gpu_list, model=model, **overrides)
    except SettingsError as exc:
        _fail(str(exc))
        return
    if dry_run:
        _print_launch_commands(settings)
        return
    configure_local_prefect()
    from flows.generate import generate
    from infra.ledger import PlanMismatch
    from infra.prompts import InputError
    from tasks.health import ServerStartFailed
    from tasks.servers import LaunchError

    try:
        summary = generate(prompts=prompts_path, output=output, engine=engine, gpus=gpu_list,
                           model=model, config_file=config_file, overrides=overrides)
    except (InputError, PlanMismatch, LaunchError, ServerStartFailed, ValueError) as exc:
        _fail(str(exc), code=1)
        return
    _print_summary(summary)


def _print_launch_commands(settings: Any) -> None:
    from tasks.servers import build_launch_specs

    try:
        specs = build_launch_specs(settings, Path(settings.output).resolve())
    except ValueError as exc:
        _fail(str(exc))
        return
    for spec in specs:
        print(spec.shell_line())


def _print_summary(summary: dict[str, Any]) -> None:
    table = Table(title="servers", show_edge=False)
    for col in ("url", "max_running_requests", "max_total_num_tokens", "max_mamba_cache_size"):
        table.add_column(col)
    for srv in summary["servers"]:
        table.add_row(*(str(srv[c]) for c in ("url", "max_running_requests",
                                              "max_total_num_tokens", "max_mamba_cache_size")))
    console.print(
        f"[bold]done[/]: {summary['prompts_done_this_run']} prompts this run "
        f"({summary['already_committed']} were already committed, "
        f"{summary['errors_this_run']} errors) of {summary['prompts_total']}; "
        f"{summary['output_tokens']} output tokens in {summary['seconds']} s = "
        f"{summary['tok_s']} tok/s ({summary['tok_s_modeled_gpu_time']} tok/s in modeled GPU "
        "time)")
    if summary["servers"]:
        console.print(table)
    console.print(f"output: {summary['output']}")


@app.command()
def settings() -> None:
    """List every setting with its default; set them via TOML, EXPANSION_* env or --set."""
    from flows.settings import settings_fields

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
    from flows.settings import SettingsError, load_settings
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


def main() -> None:
    try:
        app()
    except BrokenPipeError:
        sys.exit(0)


if __name__ == "__main__":
    main()
