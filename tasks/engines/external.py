"""Servers started by someone else, at `server_urls`: a Kubernetes deployment, a Slurm job,
a router's backends.

The job measures each one's capacity, monitors and diagnoses them, and writes exactly-once
output as usual; it never starts, stops or restarts them, so the tuner advises (the flags to
relaunch with and the gain predicted, in the summary and a `tuning-advice` artifact) instead
of acting. The flags the advice starts from are the job's `[server]` section: say there what
they run with.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import httpx

from infra.processes import ProcessRecord
from infra.sglang.flags import ServerFlags
from infra.sglang.launch import LaunchSpec
from infra.sglang.memory import DEFAULT_VERSION
from infra.sglang.versions import SGLangVersion, parse_version
from tasks.engines.sglang_family import SGLangFamily
from tasks.local_servers import ServerHandle, StopReport


class ExternalServers(SGLangFamily):
    name = "external"
    owns_servers = False

    def version(self) -> SGLangVersion:
        return parse_version(self.settings.sglang_version or DEFAULT_VERSION)

    def check_before_start(self) -> None:
        """Every server answers /health before anything starts (else a typo in a URL shows
        only when the dispatcher gives up on it)."""
        settings = self.settings
        headers = ({"Authorization": f"Bearer {settings.api_key.get_secret_value()}"}
                   if settings.api_key else {})
        for url in settings.server_urls:
            try:
                status = httpx.get(f"{url}/health", timeout=5.0, headers=headers).status_code
            except httpx.HTTPError as exc:
                raise ValueError(f"server_urls: {url} does not answer ({type(exc).__name__}); "
                                 "start it or fix the URL") from None
            if status != 200:
                raise ValueError(f"server_urls: {url}/health answered {status}; wait until it "
                                 "is up (or give api_key if it needs one)")

    def launch_specs(self, flags: ServerFlags, output: Path,
                     epoch: int = 1) -> list[LaunchSpec]:
        return []  # nothing to launch

    def start(self, flags: ServerFlags, output: Path, epoch: int) -> list[ServerHandle]:
        """Handles on the servers: no process of ours (pid 0: the health wait asks /health
        only), no log of ours."""
        handles = []
        for index, url in enumerate(self.settings.server_urls):
            parts = urlsplit(url)
            port = parts.port or (443 if parts.scheme == "https" else 80)
            record = ProcessRecord(0, 0, port, parts.hostname or "", "", [])
            handles.append(ServerHandle(index, -1, url, "", record,
                                        flags.fingerprint()))
        return handles

    def stop(self, handles: list[ServerHandle], output: Path) -> StopReport | None:
        return None  # someone else's: never stopped
