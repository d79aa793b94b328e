"""Single-machine alternative to a work pool: `python flows/serve.py` serves deployment
`generate/expansion` from this process; `prefect deployment run generate/expansion` then runs
it here. Parameters default to the embedded demo; pass --param to override."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infra.prefect_env import configure_local_prefect

configure_local_prefect()

from flows.generate import generate  # noqa: E402

if __name__ == "__main__":
    generate.serve(name="expansion", parameters={"output": "expansion-output/served"})
