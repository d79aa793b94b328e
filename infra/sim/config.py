"""The simulator's inputs: SGLang's own argv, plus sim-only knobs from EXPANSION_SIM_* env vars.

Taking SGLang's flags verbatim is what lets `engine=sim` and `engine=sglang` share one launch
path; what a real server learns from its hardware (GPU model, startup time) comes from env.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from infra.sglang.flag_parser import add_server_flags, flags_from, release_extra_args
from infra.sglang.flags import ServerFlags
from infra.sglang.versions import parse_version


@dataclass(frozen=True)
class Faults:
    """Fault injection for tests: each field off by default."""

    error_rate: float = 0.0  # share of generate calls answered with HTTP 500
    reset_rate: float = 0.0  # share of generate calls whose connection is dropped
    hang_rate: float = 0.0  # share of generate calls that never answer
    crash_after_requests: int | None = None  # exit(1) abruptly after N completed requests
    # A prompt containing this text kills the server when it is scheduled, every time (some
    # real inputs hit a kernel fault; no client-side check can see them coming).
    crash_on_text: str | None = None
    fail_start: str | None = None  # "oom" or "error": refuse to start
    # "oom" or "error": start once per port, then refuse every restart there (a GPU that an
    # Xid error left unusable; needs `start_marker_dir`)
    fail_restart: str | None = None
    start_delay_s: float | None = None  # override the startup delay
    oom_above_mem_fraction: float | None = None  # CUDA OOM at start above this fraction
    # A GPU in a bad state until its server restarts (clocks stuck low, a stray process's
    # kernels): the servers on these ports run `degraded_speed` × as fast on their first
    # start.
    degraded_ports: tuple[int, ...] = ()
    degraded_speed: float = 0.4
    # A marker file per port there says a server has started on it (degraded_ports and
    # fail_restart read it: a sim process keeps no memory of its own across restarts).
    start_marker_dir: str | None = None


def fault_problem(faults: dict[str, object]) -> str | None:
    """What is wrong with a `sim.faults` value, in one line naming the field; None if nothing."""
    known = {f.name for f in dataclasses.fields(Faults)}
    unknown = sorted(set(faults) - known)
    if unknown:
        return f"sim.faults: unknown fault {unknown[0]!r}; known: {', '.join(sorted(known))}"
    for name in ("fail_start", "fail_restart"):
        if faults.get(name) not in (None, "oom", "error"):
            return f"sim.faults.{name}: {faults[name]!r} is not 'oom' or 'error'"
    if (faults.get("fail_restart") or faults.get("degraded_ports")) and not faults.get(
            "start_marker_dir"):
        return ("sim.faults: fail_restart and degraded_ports need start_marker_dir (a folder "
                "where each start leaves a marker) to tell a restart from a first start")
    return None


@dataclass(frozen=True)
class SimConfig:
    model: str
    host: str
    port: int
    api_key: str | None
    flags: ServerFlags
    gpu: str = "rtx-pro-6000"
    version: str = "0.5.23"
    time_scale: float = 1.0
    startup_s: float | None = None  # None: modeled from the weights (see modeled_startup_s)
    seed: int = 0
    accept_len: float | None = None
    decode_log_interval: int = 40
    attention_backend: str | None = None  # SGLang's --attention-backend (checked at start)
    skip_tokenizer_init: bool = False  # SGLang then takes input_ids only, answers output_ids
    weights_gib: float | None = None  # for a config.json model folder without an index
    faults: Faults = field(default_factory=Faults)
    output_lengths: tuple[int, int] | None = None  # (mean, p99) of answers without ignore_eos


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m infra.sim",
                                description="Simulated SGLang server (SGLang's flags).")
    p.add_argument("--model-path", "--model", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--api-key")
    add_server_flags(p)  # every ServerFlags field, by SGLang's names
    p.add_argument("--decode-log-interval", type=int, default=40)
    p.add_argument("--skip-tokenizer-init", action="store_true")
    p.add_argument("--attention-backend")
    return p


def merge_config_file(argv: list[str]) -> list[str]:
    """SGLang's `--config FILE.yaml`: its keys become flags placed before the command line's
    own, so the command line wins (sglang/srt/utils/server_args_config_parser.py)."""
    if "--config" not in argv:
        return argv
    at = argv.index("--config")
    if at + 1 >= len(argv):
        raise ValueError("No config file specified after --config flag!")
    path = Path(argv[at + 1])
    if path.suffix.lower() not in (".yaml", ".yml"):
        raise ValueError(f"Config file must be YAML format, got: {path.suffix}")
    if not path.exists():
        raise ValueError(f"Config file not found: {path}")
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    if not isinstance(data, dict):
        raise ValueError("Config file must contain a dictionary at root level")
    extra: list[str] = []
    for key, value in data.items():
        if isinstance(value, bool):
            extra += [f"--{key}"] if value else []
        elif isinstance(value, list):
            extra += [f"--{key}", *map(str, value)] if value else []
        elif isinstance(value, dict):
            extra += [f"--{key}", json.dumps(value)]
        else:
            extra += [f"--{key}", str(value)]
    return extra + argv[:at] + argv[at + 2:]


def parse_sim_args(argv: list[str], env: dict[str, str] | None = None) -> SimConfig:
    """Parse SGLang argv. Flags beyond ServerFlags' fields ride in its extra_args, as the
    pipeline's own plan carries them: those the model reads (`--cuda-graph-max-bs`,
    `--load-format`, `--linear-attn-backend`) change what the server does, the rest are kept
    as given — a server that dropped them would run batches past 256 eager where the plan
    raised the graphs."""
    env = dict(os.environ) if env is None else env
    ns, unknown = _parser().parse_known_args(merge_config_file(argv))
    version = env.get("EXPANSION_SIM_SGLANG_VERSION", "0.5.23")
    # SGLang's argparse exits on a flag it does not have; carrying one would serve as if it
    # meant something
    flags = flags_from(ns, extra_args=release_extra_args(unknown, parse_version(version)))
    faults_raw = env.get("EXPANSION_SIM_FAULTS")
    faults = Faults(**json.loads(faults_raw)) if faults_raw else Faults()
    accept = env.get("EXPANSION_SIM_ACCEPT_LEN")
    return SimConfig(
        model=ns.model_path, host=ns.host, port=ns.port, api_key=ns.api_key, flags=flags,
        gpu=env.get("EXPANSION_SIM_GPU", "rtx-pro-6000"),
        version=version,
        time_scale=float(env.get("EXPANSION_SIM_TIME_SCALE", "1")),
        startup_s=float(env["EXPANSION_SIM_STARTUP_S"]) if env.get("EXPANSION_SIM_STARTUP_S")
        else None,
        seed=int(env.get("EXPANSION_SIM_SEED", "0")),
        accept_len=float(accept) if accept else None,
        decode_log_interval=ns.decode_log_interval,
        skip_tokenizer_init=ns.skip_tokenizer_init, attention_backend=ns.attention_backend,
        weights_gib=float(env["EXPANSION_SIM_WEIGHTS_GIB"]) if env.get("EXPANSION_SIM_WEIGHTS_GIB")
        else None,
        faults=faults,
        output_lengths=_lengths(env.get("EXPANSION_SIM_OUTPUT_LENGTHS")),
    )


def _lengths(raw: str | None) -> tuple[int, int] | None:
    if not raw:
        return None
    mean, p99 = (int(v) for v in raw.split(","))
    return mean, p99
