"""Defaults that make Prefect's local, ephemeral mode dependable on a fresh machine.

Measured here (../shared/prefect-notes.md): the first ephemeral start on a fresh PREFECT_HOME
migrates a new SQLite database and can exceed Prefect's default 20 s timeout; telemetry
lookups fail offline and log errors. Only unset variables are given defaults.
"""

from __future__ import annotations

import os

LOCAL_DEFAULTS = {
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "300",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_EVENTS_WORKER_MAX_QUEUE_SIZE": "10000",
    "PREFECT_LOGGING_LOG_PRINTS": "false",
}


def configure_local_prefect() -> None:
    """Set the defaults above; call before Prefect is imported."""
    for key, value in LOCAL_DEFAULTS.items():
        os.environ.setdefault(key, value)
