"""Single-machine alternative to a work pool: `python flows/serve.py` serves deployment
`generate/expansion` from this process; `prefect deployment run generate/expansion` then runs
it here. Parameters default to the embedded demo; pass --param to override.

Serving under a name rewrites that deployment to be served by this process (no work pool,
paused once it stops). If `prefect deploy` already put `generate/expansion` on a work pool,
serving it here would silently take it off the pool its workers serve: that is refused in one
line, and `--name` serves under another name instead.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infra.prefect_env import configure_local_prefect

configure_local_prefect()

from flows.generate import generate  # noqa: E402


def work_pool_of(deployment: str) -> str | None:
    """The work pool deployment `flow/name` runs on; None when it has none or does not exist."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            return client.read_deployment_by_name(deployment).work_pool_name
        except ObjectNotFound:
            return None


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--name", default="expansion",
                        help="deployment name (generate/<name>); default expansion")
    name = parser.parse_args(argv).name
    pool = work_pool_of(f"generate/{name}")
    if pool is not None:
        print(f"error: --name: deployment generate/{name} runs on work pool {pool!r} (from "
              "`prefect deploy`); serving it here would take it off that pool. Serve under "
              f"another name (python flows/serve.py --name {name}-local) or delete it first "
              f"(prefect deployment delete generate/{name})", file=sys.stderr)
        return 2
    generate.serve(name=name, parameters={"output": "expansion-output/served"})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
