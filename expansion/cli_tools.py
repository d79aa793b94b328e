"""`expansion sim`, `setup-prefect`, `install-automation`: the pieces around a job."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from expansion.cli_common import app, console, err, fail, parse_gpus, parse_sets
from infra.prefect_env import configure_local_prefect


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
    from tasks.engines import build_engine
    from tasks.health import ServerStartFailed

    try:
        settings = load_settings(None, engine="sim", gpus=parse_gpus(gpus), model=model,
                                 base_port=base_port, **parse_sets(set_ or []))
    except SettingsError as exc:
        fail(str(exc))
        return
    out = output.resolve()
    engine = build_engine(settings)
    handles = engine.start(settings.server, out, 1)
    stopping = False

    def _stop(*_: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, _stop)
    try:
        engine.wait_healthy(handles)
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
        engine.stop(handles, out)


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
        fail("PREFECT_API_URL: not set; export PREFECT_API_URL=http://127.0.0.1:4200/api "
              "(or your Prefect server's /api URL) first")
        return
    try:
        took = wait_for_api(api_url, timeout_s)
        pools = ensure_pools(pools_named())
    except PrefectSetupError as exc:
        fail(str(exc))
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
        fail(str(exc))
        return
    console.print(f"{action} automation {automation.name!r} ({automation.id})")
