"""Build SGLang launch commands: argv lists (never shell strings), version-aware flag names.

`engine=sglang` runs `python -m sglang.launch_server`; `engine=sim` runs the simulator with
the very same SGLang flags, so both share one launch, health and kill path.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from infra.sglang.flags import ServerFlags
from infra.sglang.versions import SGLangVersion

REDACTED = "***"


class UnsupportedFlags(ValueError):
    """SGLang of this version would reject these flags at startup."""


@dataclass(frozen=True)
class LaunchSpec:
    """One server to start: its argv, extra environment, port and log file."""

    index: int
    gpu: int
    host: str
    port: int
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    log_path: Path = Path("server.log")
    secrets: tuple[str, ...] = ()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def shell_line(self) -> str:
        """The reusable one-line launch command, with secrets redacted."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        args = [REDACTED if a in self.secrets else a for a in self.argv]
        cmd = shlex.join(args)
        return f"{env} {cmd} > {shlex.quote(str(self.log_path))} 2>&1" if env else cmd


def check_flags(flags: ServerFlags, version: SGLangVersion, hybrid: bool) -> None:
    """Fail before launch on combinations SGLang of this version rejects (reference §1.1)."""
    strategy = flags.mamba_strategy
    if strategy != "auto" and version.strategy_flag is None:
        raise UnsupportedFlags(
            f"mamba_strategy: SGLang {version.label} has no mamba strategy flag (added "
            "2025-12-14); leave it 'auto' or upgrade SGLang")
    if (hybrid and strategy == "no_buffer" and flags.speculative
            and not flags.disable_radix_cache and version.spec_without_radix_rejects_no_buffer):
        raise UnsupportedFlags(
            f"mamba_strategy: SGLang {version.label} rejects no_buffer with speculative decoding "
            "and the radix cache; use extra_buffer or set disable_radix_cache")
    if strategy == "extra_buffer_lazy" and flags.speculative:
        raise UnsupportedFlags(
            "mamba_strategy: extra_buffer_lazy cannot be combined with speculative decoding; "
            "use extra_buffer")
    if strategy == "extra_buffer_lazy" and flags.disable_overlap_schedule:
        raise UnsupportedFlags(
            "mamba_strategy: extra_buffer_lazy needs the overlap scheduler; drop "
            "disable_overlap_schedule")


def no_buffer_demands_overlap_off(flags: ServerFlags, version: SGLangVersion) -> bool:
    """An explicit no_buffer that the release asserts on unless the overlap schedule is off
    (0.5.15+: `ServerArgs._validate_mamba_no_buffer`; only `auto` turns it off itself)."""
    return (flags.mamba_strategy == "no_buffer" and bool(version.strategy_flag)
            and version.no_buffer_needs_disable_overlap)


def server_args(flags: ServerFlags, version: SGLangVersion, *, model: str, host: str,
                port: int, api_key: str | None, hybrid: bool = True) -> list[str]:
    """The SGLang CLI flags for one server (without the executable)."""
    args = ["--model-path", model, "--host", host, "--port", str(port)]
    return args + config_args(flags, version, api_key=api_key, hybrid=hybrid)


def config_args(flags: ServerFlags, version: SGLangVersion, *, api_key: str | None = None,
                hybrid: bool = True) -> list[str]:
    """The flags that follow the model, host and port: what a configuration changes (and the
    API key), as pasted after `launch_server --model-path M --host H --port P`."""
    check_flags(flags, version, hybrid)
    args: list[str] = []
    if api_key:
        if "--config" in flags.extra_args:
            raise UnsupportedFlags(
                "server.extra_args: --config cannot be combined with api_key (the key reaches "
                "SGLang in a private --config file of its own); move those options into the "
                "server settings or extra_args")
        args += ["--api-key", api_key]
    value_flags: list[tuple[str, object]] = [
        ("--mem-fraction-static", flags.mem_fraction_static),
        ("--max-running-requests", flags.max_running_requests),
        ("--max-total-tokens", flags.max_total_tokens),
        ("--max-mamba-cache-size", flags.max_mamba_cache_size),
        ("--mamba-full-memory-ratio", flags.mamba_full_memory_ratio),
        ("--mamba-ssm-dtype", flags.mamba_ssm_dtype),
        ("--context-length", flags.context_length),
        ("--page-size", flags.page_size),
        ("--chunked-prefill-size", flags.chunked_prefill_size),
        ("--tp-size", flags.tp_size if flags.tp_size != 1 else None),
        ("--speculative-algorithm", flags.speculative_algorithm),
        ("--speculative-num-steps", flags.speculative_num_steps),
        ("--speculative-eagle-topk", flags.speculative_eagle_topk),
        ("--speculative-num-draft-tokens", flags.speculative_num_draft_tokens),
    ]
    if flags.kv_cache_dtype != "auto":
        value_flags.append(("--kv-cache-dtype", flags.kv_cache_dtype))
    for name, value in value_flags:
        if value is not None:
            args += [name, str(value)]
    if flags.mamba_strategy != "auto" and version.strategy_flag:
        args += [version.strategy_flag, flags.mamba_strategy]
    if flags.disable_overlap_schedule or no_buffer_demands_overlap_off(flags, version):
        args.append("--disable-overlap-schedule")
    if flags.disable_radix_cache:
        args.append("--disable-radix-cache")
    if flags.enable_metrics:
        args.append("--enable-metrics")
    args += list(flags.extra_args)
    return args


def every_flag_name(flags: ServerFlags, version: SGLangVersion) -> list[str]:
    """Every `--flag` the builder emits for these flags (for checks against SGLang's parser)."""
    args = server_args(flags, version, model="m", host="127.0.0.1", port=1, api_key="k")
    return [a for a in args if a.startswith("--")]
