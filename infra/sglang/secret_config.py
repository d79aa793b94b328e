"""Keep secrets off the server's command line: SGLang's `--config FILE.yaml` carries them.

A process's argv is readable by every user of the machine (`ps`, /proc/PID/cmdline) and is
stored in the job's process registry. So at spawn time each secret-valued `--flag VALUE`
pair is moved into a private YAML file (0600, in a 0700 per-user directory outside the
output folder) passed as `--config`; SGLang merges it into its arguments at parse time
(sglang/srt/utils/server_args_config_parser.py), and so does the simulator. The file is
deleted as soon as the server answers /health (it has parsed its arguments long before),
and again, if still there, when the server is stopped.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

import yaml


def private_dir() -> Path:
    """A per-user directory only its owner can enter."""
    path = Path(tempfile.gettempdir()) / f"expansion-secrets-{os.getuid()}"
    path.mkdir(mode=0o700, exist_ok=True)
    if path.stat().st_uid != os.getuid():
        raise PermissionError(f"{path} belongs to another user; set TMPDIR to a private folder")
    path.chmod(0o700)
    return path


def split_secret_flags(argv: Sequence[str], secrets: Sequence[str],
                       ) -> tuple[list[str], dict[str, str]]:
    """(argv without the `--flag SECRET` pairs, {flag-name: SECRET})."""
    public: list[str] = []
    hidden: dict[str, str] = {}
    args = list(argv)
    i = 0
    while i < len(args):
        if (args[i].startswith("--") and i + 1 < len(args) and args[i + 1] in secrets
                and args[i + 1]):
            hidden[args[i][2:]] = args[i + 1]
            i += 2
            continue
        public.append(args[i])
        i += 1
    return public, hidden


def hide_secrets(argv: Sequence[str], secrets: Sequence[str]) -> tuple[list[str], Path | None]:
    """argv safe to show, plus the private `--config` file holding the secrets (or None)."""
    public, hidden = split_secret_flags(argv, secrets)
    if not hidden:
        return public, None
    fd, name = tempfile.mkstemp(prefix="server-", suffix=".yaml", dir=private_dir())
    with os.fdopen(fd, "w", encoding="utf-8") as fh:  # mkstemp creates it 0600
        yaml.safe_dump(hidden, fh, default_flow_style=False)
    return [*public, "--config", name], Path(name)


def discard(path: str | Path | None) -> None:
    if path:
        with contextlib.suppress(FileNotFoundError):
            Path(path).unlink()


def secret_file_of(argv: Sequence[str]) -> Path | None:
    """The private `--config` file in a server's argv, if we made one (never a user's own)."""
    args = list(argv)
    for flag, value in itertools.pairwise(args):
        if flag == "--config" and Path(value).parent == private_dir():
            return Path(value)
    return None
