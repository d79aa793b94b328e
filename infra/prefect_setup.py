"""Get a Prefect server ready for `prefect deploy`: wait until its API answers, create the
work pools that `deployments/prefect.yaml` names.

`prefect server start --background` returns before the API answers, and `prefect deploy`
fails on a pool nobody created; both cost a new user their first hour. Pools are created
with Prefect's own client, as `prefect work-pool create NAME --type process` would.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import yaml

PREFECT_FILE = Path(__file__).resolve().parents[1] / "deployments" / "prefect.yaml"


class PrefectSetupError(RuntimeError):
    """The Prefect API cannot be used; the message says what to fix."""


def pools_named(prefect_file: Path = PREFECT_FILE) -> list[str]:
    """The work pools the deployments in a prefect.yaml use, in order."""
    spec = yaml.safe_load(prefect_file.read_text()) or {}
    names: list[str] = []
    for deployment in spec.get("deployments") or []:
        name = ((deployment or {}).get("work_pool") or {}).get("name")
        if name and name not in names:
            names.append(name)
    return names


def wait_for_api(api_url: str, timeout_s: float) -> float:
    """Seconds until `api_url`/health answers 200; PrefectSetupError after the timeout."""
    started = time.monotonic()
    last = "no answer"
    while time.monotonic() - started < timeout_s:
        try:
            resp = httpx.get(f"{api_url.rstrip('/')}/health", timeout=5)
            if resp.status_code == 200:
                return time.monotonic() - started
            last = f"HTTP {resp.status_code}"
        except httpx.HTTPError as exc:
            last = type(exc).__name__
        time.sleep(0.5)
    raise PrefectSetupError(
        f"PREFECT_API_URL: {api_url} did not answer /health within {timeout_s:.0f} s "
        f"({last}); start it with `prefect server start --background` or fix the URL")


def ensure_pools(names: list[str]) -> list[tuple[str, str]]:
    """Create each missing pool as a process pool; (name, 'created' | 'exists')."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectNotFound

    done = []
    with get_client(sync_client=True) as client:
        for name in names:
            try:
                client.read_work_pool(name)
                done.append((name, "exists"))
            except ObjectNotFound:
                client.create_work_pool(WorkPoolCreate(name=name, type="process"))
                done.append((name, "created"))
    return done
