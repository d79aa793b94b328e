"""The temporary Prefect API of an ad-hoc `expansion run`, started so that Ctrl-C cannot kill it.

Without `PREFECT_API_URL`, Prefect starts a temporary API server (uvicorn) as a child in the
run's process group. A terminal's Ctrl-C signals the whole foreground group, so that server died
first and the run, still stopping its fleet, spent 78–218 s failing to record its own end
("Error logging to API", 1,917 lines, five tracebacks); `kill -TERM` of the run left the server
behind, parented to init. Here the server runs in its own session (a terminal's signals do not
reach it), dies with the run (PR_SET_PDEATHSIG, even under SIGKILL) and is stopped at exit
after Prefect's log and event queues have drained into it (stopped any earlier, those queues
wait on it forever). With `PREFECT_API_URL` set nothing is started.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from infra.processes import die_with_parent


def _detached_server_class() -> type:
    """Prefect's SubprocessASGIServer, its uvicorn child started in a session of its own."""
    import prefect
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import get_current_settings

    class DetachedApiServer(SubprocessASGIServer):
        def _run_uvicorn_command(self) -> subprocess.Popen[Any]:
            # Prefect 3.9's own command (prefect/server/api/server.py), in a new session
            return subprocess.Popen(
                [sys.executable, "-m", "uvicorn", "--app-dir",
                 str(prefect.__module_path__.parent), "--factory",
                 "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port",
                 str(self.port), "--log-level", "error", "--lifespan", "on"],
                env={**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1",
                     "PREFECT__SERVER_FINAL": "1",
                     **get_current_settings().to_environment_variables(exclude_unset=True)},
                start_new_session=True, preexec_fn=die_with_parent, stdin=subprocess.DEVNULL)

    return DetachedApiServer


def use_temporary_api() -> str | None:
    """Point this process, for the rest of its life, at a temporary API that outlives an
    interrupt; its URL, or None when `PREFECT_API_URL` names a server already. Prefect's
    start() registers the stop with atexit, which runs after its queues have drained."""
    from prefect.settings import PREFECT_API_URL, get_current_settings, temporary_settings

    if get_current_settings().api.url:
        return None
    server = _detached_server_class()()
    server.start()
    temporary_settings({PREFECT_API_URL: server.api_url}).__enter__()  # never left
    return str(server.api_url)
