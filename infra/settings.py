"""Job settings (a leaf module: tasks and flows both read it): defaults < TOML file < `.env` <
EXPANSION_* env vars < explicit overrides.

Nested groups use `__` in env vars: `EXPANSION_SERVER__MEM_FRACTION_STATIC=0.9`.
An invalid value fails fast with the field's dotted name and what is allowed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)
from pydantic_settings import SettingsError as PydanticSettingsError

from infra.sglang.flags import ServerFlags

SAMPLE_PROMPTS = Path(__file__).resolve().parents[1] / "flows" / "data" / "sample_prompts.jsonl"


class SettingsError(ValueError):
    """A setting is invalid; the message names the field and the fix."""


class SamplingSettings(BaseModel):
    """Job-wide sampling defaults; per-row values in the input override them."""

    model_config = ConfigDict(extra="forbid")
    max_new_tokens: int = Field(256, ge=1, le=1_000_000)
    temperature: float = Field(0.7, ge=0, le=10)
    top_p: float = Field(0.95, gt=0, le=1)
    seed: int | None = Field(0, description="sampling seed sent with each request (SGLang "
                             "applies it only with --enable-deterministic-inference)")
    ignore_eos: bool = Field(False, description="generate max_new_tokens every time (fixed "
                             "lengths: benchmarks, random-weight models)")
    n: int = Field(1, ge=1, le=1024, description="samples per prompt: one output row per "
                   "sample, with sample_index 0..n-1 (sample k uses seed + k)")
    stop: list[str] = Field(default_factory=list, description="stop strings for every row "
                            "without a json_schema/regex/ebnf constraint (a row's `stop` column "
                            "replaces them); not included in the output")


class ClientSettings(BaseModel):
    """How the dispatcher talks to the fleet."""

    model_config = ConfigDict(extra="forbid")
    concurrency_per_server: int | None = Field(
        None, ge=1, le=4096,
        description="in-flight requests per server; default: its max_running_requests + queue")
    queue_target: int = Field(4, ge=0, le=1024,
                              description="requests kept queued beyond a server's cap")
    request_timeout_s: float = Field(600.0, gt=0)
    max_attempts: int = Field(5, ge=1, le=100, description="tries per prompt on transient errors")
    backoff_s: float = Field(0.5, gt=0, description="first retry delay (doubles, with jitter)")
    prefix_affinity_chars: int = Field(
        1024, ge=0, le=1_000_000,
        description="prompts whose first N characters (token ids: N/4) agree go to one server, "
                    "one of them first, so the radix cache reuses their prefix; 0: off")


class SimSettings(BaseModel):
    """The simulated fleet (engine=sim)."""

    model_config = ConfigDict(extra="forbid")
    gpu: str = Field("rtx-pro-6000", description="GPU profile the simulator models")
    time_scale: float = Field(20.0, gt=0, le=100_000,
                              description="modeled GPU seconds per wall second")
    startup_s: float | None = Field(
        None, ge=0, le=3600,
        description="wall seconds to become healthy; default: modeled (imports + weight load "
        "+ graph capture) / time_scale")
    sglang_version: str = Field("0.5.23", description="SGLang release the simulator imitates")
    faults: dict[str, Any] = Field(default_factory=dict,
                                   description="fault injection, see infra/sim/config.py")
    output_mean_tokens: int | None = Field(
        None, ge=1, description="answers without ignore_eos end, on average, after this many "
        "tokens (lognormal with output_p99_tokens; cut at max_new_tokens); default: uniform "
        "in 0.3–1.3 × max_new_tokens")
    output_p99_tokens: int | None = Field(
        None, ge=2, description="99th percentile of answer lengths, with output_mean_tokens")

    @field_validator("faults")
    @classmethod
    def _known_faults(cls, faults: dict[str, Any]) -> dict[str, Any]:
        """A misspelt fault would start servers that inject nothing: refuse it here."""
        from infra.sim.config import fault_problem

        problem = fault_problem(faults)
        if problem:
            raise ValueError(problem)
        return faults

    @model_validator(mode="after")
    def _lengths_go_together(self) -> SimSettings:
        mean, p99 = self.output_mean_tokens, self.output_p99_tokens
        if (mean is None) != (p99 is None):
            raise ValueError("sim.output_mean_tokens and sim.output_p99_tokens go together: "
                             "set both, or neither")
        if mean is not None and p99 is not None and p99 <= mean:
            raise ValueError(f"sim.output_p99_tokens ({p99}) must exceed "
                             f"sim.output_mean_tokens ({mean})")
        return self


class StorageSettings(BaseModel):
    """Object storage for `output`/`upload_to` = s3://bucket/prefix (boto3 credential chain)."""

    model_config = ConfigDict(extra="forbid")
    endpoint_url: str | None = Field(None, description="S3-compatible endpoint (MinIO, R2, ...)")
    region: str | None = Field(None, description="bucket region (default us-east-1)")
    multipart_mb: int = Field(64, ge=5, le=5000, description="multipart threshold and part size")
    staging_dir: str = Field("expansion-staging",
                             description="local working copy when output is s3://")
    upload_retry_delays_s: tuple[NonNegativeFloat, ...] = Field(
        (2.0, 8.0, 30.0, 60.0), max_length=20,
        description="waits between tries of the final upload; a bucket still unreachable "
                    "after them ends the run (every shard stays committed locally)")


class TuningSettings(BaseModel):
    """Restart-on-regression: diagnose, reconfigure, relaunch, resume (docs/TUNING.md)."""

    model_config = ConfigDict(extra="forbid")
    enabled: bool = Field(True, description="restart with a better config when one is found")
    target_tok_s_per_gpu: float | None = Field(
        None, gt=0, description="restart when throughput stays below this (modeled GPU time)")
    window_s: float = Field(60.0, gt=0, description="wall seconds of steady state to judge")
    sample_interval_s: float = Field(5.0, gt=0, description="how often /metrics is sampled")
    max_restarts: int = Field(3, ge=0, le=20, description="restart budget for the whole job")
    min_predicted_gain: float = Field(
        1.05, ge=1.0, description="never restart for a predicted gain below this (the "
        "model's own error), however much work is left")
    restart_payback: float = Field(
        3.0, ge=1.0, le=100, description="a restart must be predicted to save this many "
        "times its own cost (start-up, drain, redone requests) over the work left")
    avg_context: float = Field(2048.0, gt=0,
                               description="tokens in context per request, for predictions")
    drain_timeout_s: float = Field(
        3.0, ge=0, le=3600, description="before a restart, how long in-flight requests of "
        "shards that can still complete may finish (the rest are redone after)")
    allow_lossy: bool = Field(False, description="let the tuner change numerics (bf16 SSM "
                              "state, fp8 KV): faster, but outputs change")
    canary_servers: int = Field(
        1, ge=0, le=64, description="try a candidate config on this many servers while the "
        "rest keep generating, then roll it out one server at a time or roll it back; 0, or "
        "a fleet of one server: stop and restart the whole fleet instead")
    canary_min_gain: float = Field(
        1.03, ge=1.0, description="roll a candidate out only when the canary servers beat "
        "the others by this factor over the same window")


class JobSettings(BaseSettings):
    """Everything a `generate` run needs; `expansion settings` lists every field."""

    model_config = SettingsConfigDict(
        env_prefix="EXPANSION_", env_nested_delimiter="__", env_file=".env",
        env_file_encoding="utf-8", extra="forbid", validate_default=True,
    )

    prompts: Path = Field(SAMPLE_PROMPTS, description="input: JSONL or Parquet with id + prompt")
    output: str = Field("expansion-output",
                        description="output folder, or s3://bucket/prefix (staged locally)")
    upload_to: str | None = Field(None, description="also copy committed shards here "
                                  "(s3://bucket/prefix or a folder)")
    engine: Literal["sim", "sglang", "external", "vllm"] = Field(
        "sim", description="sim (simulated fleet), sglang (servers this job starts), "
        "external (servers someone else runs, at server_urls: never stopped or restarted), "
        "or vllm (`vllm serve` servers this job starts; measured, never tuned)")
    server_urls: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="engine=external: the servers' base URLs, "
        "comma-separated (http://host:port); describe their flags under [server]")
    gpus: Annotated[list[int], NoDecode] = Field(default_factory=lambda: [0, 1], min_length=1,
                            description="GPU indices, one server per GPU")
    servers_per_gpu: int = Field(
        1, ge=1, le=16, description="SGLang servers per GPU (small models): ports follow "
        "one another; give each a small server.mem_fraction_static — SGLang sizes its pools "
        "from the memory free when it starts, so fix them with server.max_mamba_cache_size "
        "and server.max_total_tokens for servers that are alike; tuning is off (the memory "
        "model plans whole GPUs)")
    model: str = Field("Qwen/Qwen3.6-27B", description="model path or HF id")
    weights_gib: float | None = Field(
        None, gt=0, description="GiB of weights per GPU, for planning a local model folder "
        "that has no model.safetensors.index.json (e.g. --load-format dummy)")
    gpu_type: str = Field("rtx-pro-6000", description="GPU profile for planning (sim: modeled)")
    host: str = Field("127.0.0.1", description="address servers bind to")
    base_port: int = Field(30000, ge=1024, le=65000, description="server i listens on base+i")
    api_key: SecretStr | None = Field(None, description="passed to SGLang and every client call")
    sglang_version: str | None = Field(None, description="default: detected from the install")
    python: str | None = Field(None, description="python that runs SGLang (default: this one)")
    server: ServerFlags = Field(default_factory=lambda: ServerFlags())
    client: ClientSettings = Field(default_factory=lambda: ClientSettings())
    sampling: SamplingSettings = Field(default_factory=lambda: SamplingSettings())
    sim: SimSettings = Field(default_factory=lambda: SimSettings())
    storage: StorageSettings = Field(default_factory=lambda: StorageSettings())
    tuning: TuningSettings = Field(default_factory=lambda: TuningSettings())
    shard_size: int = Field(100, ge=1, le=10_000_000, description="prompts per output shard")
    keep_input_columns: bool = Field(
        True, description="copy the input's own columns (beyond id, prompt and the request "
        "columns) into every output row; false keeps the output to id + generation fields")
    startup_timeout_s: float = Field(900.0, gt=0, description="deadline for servers to be healthy")
    stop_grace_s: float = Field(30.0, ge=0, description="SIGTERM → SIGKILL grace period")
    force_takeover: bool = Field(
        False, description="take the output folder's lease even from a run that looks alive "
        "(infra/lease.py): for the operator who knows it is dead")

    @field_validator("gpus", mode="before")
    @classmethod
    def _split_gpus(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [int(v) for v in value.replace(" ", "").split(",") if v]
        if isinstance(value, int):
            return [value]
        return value

    @field_validator("server_urls", mode="before")
    @classmethod
    def _split_urls(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [v.strip() for v in value.split(",") if v.strip()]
        return value

    @field_validator("server_urls")
    @classmethod
    def _check_urls(cls, value: list[str]) -> list[str]:
        bad = [u for u in value if not u.startswith(("http://", "https://"))]
        if bad:
            raise ValueError(f"{bad[0]!r} is not a URL; give http://host:port")
        if len(set(value)) != len(value):
            raise ValueError("a server is listed twice")
        return [u.rstrip("/") for u in value]

    @model_validator(mode="after")
    def _urls_with_external(self) -> JobSettings:
        if self.engine == "external" and not self.server_urls:
            raise ValueError("server_urls: engine=external needs the servers' URLs, e.g. "
                             "--server-urls http://node1:30000,http://node2:30000")
        if self.engine != "external" and self.server_urls:
            raise ValueError("server_urls: only for engine=external (this job starts its "
                             "own servers); remove it or set engine=external")
        return self

    @field_validator("gpus")
    @classmethod
    def _unique_gpus(cls, value: list[int]) -> list[int]:
        if len(set(value)) != len(value) or any(v < 0 for v in value):
            raise ValueError("GPU indices must be distinct and ≥ 0, e.g. 0,1,2")
        return value

    def local_output(self) -> Path:
        """The folder that holds the manifest and shards: `output`, or a staging copy of an
        s3:// output."""
        if self.output.startswith("s3://"):
            bucket_and_prefix = self.output.removeprefix("s3://").strip("/")
            return (Path(self.storage.staging_dir) / bucket_and_prefix).resolve()
        return Path(self.output).resolve()

    def upload_target(self) -> str | None:
        return self.output if self.output.startswith("s3://") else self.upload_to

    def node_paths(self, node: str | None) -> tuple[Path, str | None]:
        """(local output folder, upload target) of one run. A node of a multi-node job keeps
        its own manifest under `nodes/<node>` and always publishes to the shared output."""
        if node is None:
            return self.local_output(), self.upload_target()
        return (self.local_output() / "nodes" / node,
                self.upload_target() or str(self.local_output()))

    @field_validator("output")
    @classmethod
    def _check_output(cls, value: str) -> str:
        if "://" in value and not value.startswith("s3://"):
            raise ValueError("use a folder path or s3://bucket/prefix")
        if value.startswith("s3://") and not value.removeprefix("s3://").strip("/"):
            raise ValueError("s3:// output needs a bucket: s3://bucket/prefix")
        return value

    @classmethod
    def settings_customise_sources(
        cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource, dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings, dotenv_settings]
        if settings_cls.model_config.get("toml_file"):
            sources.append(TomlConfigSettingsSource(settings_cls))
        return tuple(sources)


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "settings"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown setting; see `expansion settings` for the valid names"
        parts.append(f"{loc}: {msg} (got {err.get('input')!r})")
    return "invalid settings: " + "; ".join(parts)


def load_settings(config_file: str | Path | None = None, **overrides: Any) -> JobSettings:
    """Build settings from all sources; raise SettingsError naming the field on bad input."""
    toml_path: Path | None = None
    if config_file is not None:
        toml_path = Path(config_file)
        if not toml_path.is_file():
            raise SettingsError(f"config: {toml_path} does not exist; pass a TOML file path")
    cls = type("JobSettingsFromFile", (JobSettings,), {
        "model_config": SettingsConfigDict(**{**JobSettings.model_config,
                                              "toml_file": toml_path})})
    try:
        import tomllib

        if toml_path is not None:
            tomllib.loads(toml_path.read_text())
        return cls(**_nest(overrides))
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"config: {toml_path} is not valid TOML: {exc}") from exc
    except ValidationError as exc:
        raise SettingsError(_describe(exc)) from None
    except PydanticSettingsError as exc:  # a malformed env var or .env value
        raise SettingsError(f"invalid settings: {exc}; check the EXPANSION_* variables") from None


class _Null:
    """An explicit null from the command line (`--set server.max_running_requests=null`):
    unlike None, which means "not given", it overrides a value from the config file."""

    def __repr__(self) -> str:
        return "NULL"


NULL: Any = _Null()


def _nest(flat: dict[str, Any]) -> dict[str, Any]:
    """{'server.mem_fraction_static': 0.9} → {'server': {'mem_fraction_static': 0.9}}."""
    nested: dict[str, Any] = {}
    for key, value in flat.items():
        if value is None:
            continue
        if value is NULL:
            value = None
        node = nested
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return nested


def settings_fields() -> list[tuple[str, str, str]]:
    """(dotted name, default, description) of every setting, for `expansion settings`."""
    rows: list[tuple[str, str, str]] = []

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, info in model.model_fields.items():
            ann = info.annotation
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                walk(ann, f"{prefix}{name}.")
                continue
            default = info.get_default(call_default_factory=True)
            rows.append((prefix + name, repr(default), info.description or ""))

    walk(JobSettings, "")
    return rows
