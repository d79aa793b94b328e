"""`expansion run`, `status`, `export`, `settings`: a job from the command line."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from expansion.cli_common import app, console, err, fail, parse_gpus, parse_sets
from infra.prefect_env import configure_local_prefect


@app.command()
def run(
    prompts: Annotated[Path | None, typer.Option(help="JSONL/Parquet with id + prompt "
                                                 "(or messages). Default: bundled sample.")] = None,
    output: Annotated[str | None, typer.Option(help="Output folder (resumes if it exists).")]
    = None,
    engine: Annotated[str | None, typer.Option(
        help="sim (simulated fleet), sglang, or external (servers at --server-urls).")] = None,
    server_urls: Annotated[str | None, typer.Option(
        "--server-urls", help="engine=external: the servers' URLs, comma-separated "
        "(http://host:port,...); they are never stopped or restarted.")] = None,
    gpus: Annotated[str | None, typer.Option(help="GPU indices, one server each: 0,1,...")]
    = None,
    model: Annotated[str | None, typer.Option(help="Model path or HF id.")] = None,
    config_file: Annotated[Path | None, typer.Option(
        "--config", help="TOML settings file.")] = None,
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
    force_takeover: Annotated[bool, typer.Option(
        "--force-takeover", help="Take the output folder from the run that holds it, alive "
        "or not (you know it is dead: its host is gone).")] = False,
) -> None:
    """Run the `generate` flow now (ad hoc), on a simulated or real SGLang fleet."""
    overrides = parse_sets(set_ or [])
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
        "server_urls": server_urls,
        "prompts": str(prompts) if prompts else None, "output": output, "engine": engine,
        "gpus": parse_gpus(gpus), "model": model,
        "force_takeover": force_takeover or None,
    }
    # A named option wins over `--set` of the same field (both are on the command line).
    overrides.update({k: v for k, v in shortcuts.items() if v is not None})
    toml_path = str(config_file) if config_file else None
    from infra.settings import SettingsError, load_settings

    try:
        settings = load_settings(toml_path, **overrides)
    except SettingsError as exc:
        fail(str(exc))
        return
    if dry_run:
        _print_launch_commands(settings)
        return
    _run_now(settings, toml_path, overrides)


def _keep_secret_out_of_parameters(params: dict[str, Any]) -> None:
    """`--set api_key=…` reaches the flow through the environment, not as a parameter:
    Prefect stores a flow run's parameters in plain text in its database (and shows them in
    the UI). The settings read EXPANSION_API_KEY as they would the parameter; here it is the
    CLI's own process, so nothing else sees it."""
    if "api_key" in params:
        key = params.pop("api_key")
        if key is None:
            os.environ.pop("EXPANSION_API_KEY", None)
        else:
            os.environ["EXPANSION_API_KEY"] = str(key)


def _run_now(settings: Any, config_file: str | None, overrides: dict[str, Any]) -> None:
    """Preflight, then the flow on the local Prefect API, with a progress bar and summary."""
    from flows.generate import preflight
    from infra.settings import NULL

    try:
        warnings = preflight(settings)  # fast, before Prefect starts and before any output
    except ValueError as exc:
        fail(str(exc))
        return
    for warning in warnings:
        err.print(f"[bold yellow]warning:[/] {escape(warning)}", highlight=False, soft_wrap=True)
    configure_local_prefect()
    from prefect import tags

    from flows.generate import generate
    from infra.manifest import PlanMismatch
    from infra.prefect_api import use_temporary_api
    from infra.prefect_runs import crash_vanished_runs, process_tag
    from infra.prompts import InputError
    from tasks.health import ServerStartFailed
    from tasks.local_servers import LaunchError
    from tasks.run_ends import RunEnd

    # The flow's own parameters show in the Prefect UI; the rest are overrides.
    top = {k: overrides.pop(k) for k in ("prompts", "output", "engine", "gpus", "model")
           if k in overrides}
    # A flow parameter is JSON: an explicit null travels as None (job_settings).
    params = {k: (None if v is NULL else v) for k, v in overrides.items()}
    _keep_secret_out_of_parameters(params)
    try:
        with _signals_as_interrupt():
            use_temporary_api()
            for name in crash_vanished_runs():
                err.print(f"note: flow run {name!r} was Running but its process is gone; "
                          "marked Crashed", highlight=False, soft_wrap=True)
            with _manifest_progress(settings.local_output()), tags(process_tag()):
                summary = generate(**top, config_file=config_file, overrides=params)
    except (InputError, PlanMismatch, LaunchError, ValueError) as exc:
        fail(str(exc), code=1)
        return
    except (RunEnd, ServerStartFailed) as exc:
        _fail_with_block(exc, settings.local_output())
        return
    except KeyboardInterrupt:
        _report_interrupt(settings.local_output())
    _print_summary(summary)


@contextlib.contextmanager
def _signals_as_interrupt() -> Iterator[None]:
    """Ctrl-C and SIGTERM raise KeyboardInterrupt wherever the main thread is: the flow is
    marked Crashed and its fleet stopped. A handler of our own, because asyncio.run replaces
    Python's default one with a cancel of its main task (the dispatcher then ended on the
    servers Ctrl-C had also reached, and the run reported FleetDown)."""
    import signal

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _fail_with_block(exc: Exception, output: Path) -> None:
    """The failure's `error:` block (expansion/failure_report.py), exit code 1."""
    import logging

    from expansion.failure_report import failure_block
    from tasks.run_ends import RunEnd

    # the last thing printed is the block: not Prefect's "Stopping temporary server" at exit
    logging.getLogger("prefect").setLevel(logging.WARNING)
    kind = exc.kind if isinstance(exc, RunEnd) else "start_failed"
    for line in failure_block(kind, str(exc), output):
        err.print(line, highlight=False, soft_wrap=True, markup=False)
    raise typer.Exit(1)


def _report_interrupt(output: Path) -> None:
    """One line instead of a traceback: what is safe on disk and how to go on."""
    import signal

    from infra.manifest import Manifest

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C while we print: no trace
    try:
        done = len(Manifest(output).committed())
    except (OSError, ValueError):
        done = 0
    err.print(f"interrupted: {done} shards committed in {output}; servers stopped; run the "
              "same command again to resume", highlight=False, soft_wrap=True)
    raise typer.Exit(130)


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

    from infra.manifest import Manifest

    done = threading.Event()
    manifest = Manifest(output)

    def watch(progress: Progress) -> None:
        task_id = None
        t0, tokens0 = time.monotonic(), None
        while not done.wait(0.5):
            try:
                shard_plan = manifest.load_plan()
                committed = manifest.committed()
            except (FileNotFoundError, ValueError, TypeError):
                continue
            tokens = sum(e.output_tokens for e in committed.values())
            tokens0 = tokens if tokens0 is None else tokens0
            rate = (tokens - tokens0) / max(time.monotonic() - t0, 1e-9)
            if task_id is None:
                task_id = progress.add_task("shards", total=shard_plan.num_shards)
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
    from tasks.engines import build_engine
    from tasks.local_servers import LaunchError

    engine = build_engine(settings)
    if not engine.owns_servers:
        print(f"# engine=external: no server is started; the job uses {len(settings.server_urls)}"
              f" running server(s): {', '.join(settings.server_urls)}")
        return
    try:
        specs = engine.launch_specs(settings.server, settings.local_output())
    except (ValueError, LaunchError) as exc:
        fail(str(exc))
        return
    from infra.processes import ephemeral_port_warning

    warning = ephemeral_port_warning([s.port for s in specs])
    if warning:
        err.print(f"[bold yellow]warning:[/] {escape(warning)}", highlight=False, soft_wrap=True)
    for spec in specs:
        print(spec.shell_line())


def _print_summary(result: dict[str, Any]) -> None:
    from flows.summary import RunSummary, format_summary

    summary = RunSummary.model_validate(result)  # the flow's JSON result, typed again
    table = Table(show_edge=False)
    for col in ("server", "max_running_requests", "max_total_num_tokens", "mamba slots"):
        table.add_column(col, overflow="fold")
    for srv in summary.servers:
        table.add_row(srv.url.removeprefix("http://"), str(srv.max_running_requests),
                      str(srv.max_total_num_tokens), str(srv.max_mamba_cache_size))
    console.print(format_summary(summary), highlight=False, soft_wrap=True)
    if summary.servers:
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
    from infra.manifest import Manifest

    manifest = Manifest(output)
    try:
        shard_plan = manifest.load_plan()
    except FileNotFoundError as exc:
        fail(str(exc))
        return
    committed = manifest.committed()
    rows = sum(e.rows for e in committed.values())
    errors = sum(e.errors for e in committed.values())
    tokens = sum(e.output_tokens for e in committed.values())
    console.print(f"plan {shard_plan.fingerprint}: {len(committed)}/{shard_plan.num_shards} "
                  f"shards committed; {rows} completions, {errors} errors, of "
                  f"{shard_plan.input_rows} "
                  f"prompts; {tokens} output tokens")
    _print_owner(output)
    _print_crashes(output)


def _print_owner(output: Path) -> None:
    """Who holds the folder's lease (infra/lease.py): a live run, or one that is gone."""
    from infra.lease import FolderLease

    found = FolderLease(output).read()
    if found is None:
        return
    state = ("running" if found.alive else
             "gone (its lease is stale: the next run takes it over)")
    console.print(f"owner: {found.describe()} — {state}", highlight=False, markup=False,
                  soft_wrap=True)


def _print_crashes(output: Path) -> None:
    """What each server's log says it died of, where one did (a failed run's why)."""
    from expansion.failure_report import server_crashes

    for log, said in server_crashes(output).items():
        console.print(f"{log}: SGLang said", highlight=False, markup=False)
        for line in said[:2]:
            console.print(f"  {line}", highlight=False, markup=False, soft_wrap=True)


@app.command()
def export(
    output: Annotated[Path, typer.Argument(help="An output folder.")],
    to: Annotated[Path, typer.Option("--to", help="File to write (JSONL).")],
    model: Annotated[str, typer.Option(help="Model name if a row has none.")] = "model",
    fmt: Annotated[str, typer.Option("--format", help="openai-batch: one line per input "
                                     "(custom_id = id, n samples as choices); jsonl: every "
                                     "row with every column")] = "openai-batch",
) -> None:
    """Export completions as OpenAI batch output JSONL, or as plain JSONL rows."""
    from infra.export import export_jsonl, export_openai_batch, export_target_problem

    if not (output / "plan.json").is_file():
        fail(f"{output} has no plan.json: not an expansion output folder")
    if fmt not in ("openai-batch", "jsonl"):
        fail(f"--format: {fmt!r} is not openai-batch or jsonl")
    problem = export_target_problem(to)
    if problem:
        fail(problem)
    count = (export_openai_batch(output, to, model) if fmt == "openai-batch"
             else export_jsonl(output, to))
    console.print(f"wrote {count} lines to {to}")
