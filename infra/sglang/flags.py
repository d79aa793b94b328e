"""The SGLang server flags this project reasons about, named as SGLang names them.

One value object shared by settings, the launch command builder, the memory model and the
simulator, so a flag means the same thing everywhere.
"""

from __future__ import annotations

import hashlib
import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

MambaStrategy = Literal["auto", "no_buffer", "extra_buffer", "extra_buffer_lazy"]


MAX_MAMBA_FULL_MEMORY_RATIO = 10.0  # beyond it the KV pool is a sliver: moves stop there


def scaled_ratio(ratio: float, factor: float) -> float:
    """A mamba share `factor` × `ratio`, kept within what the setting allows."""
    return round(min(ratio * factor, MAX_MAMBA_FULL_MEMORY_RATIO), 3)


# SGLang 0.5.17 spells it --cuda-graph-max-bs-decode, with --cuda-graph-max-bs as an alias
GRAPH_MAX_BS_FLAGS = ("--cuda-graph-max-bs", "--cuda-graph-max-bs-decode")


class ServerFlags(BaseModel):
    """Server-side knobs. None means "SGLang's default" (resolved by the memory model)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mem_fraction_static: float | None = Field(
        None, gt=0, lt=1, description="share of GPU memory for weights + pools (0 < x < 1)")
    max_running_requests: int | None = Field(None, ge=1, description="cap on running requests")
    max_total_tokens: int | None = Field(None, ge=1, description="cap on the KV token pool")
    mamba_strategy: MambaStrategy = Field(
        "auto", description="--mamba-radix-cache-strategy (old: --mamba-scheduler-strategy)")
    max_mamba_cache_size: int | None = Field(None, ge=1, description="explicit mamba slot count")
    mamba_full_memory_ratio: float | None = Field(
        None, gt=0, le=MAX_MAMBA_FULL_MEMORY_RATIO,
        description="mamba : full-attention KV memory ratio (default 0.9)")
    mamba_ssm_dtype: Literal["float32", "bfloat16", "float16"] | None = None
    disable_overlap_schedule: bool = False
    disable_radix_cache: bool = False
    context_length: int | None = Field(None, ge=16)
    page_size: int | None = Field(None, ge=1)
    chunked_prefill_size: int | None = None
    kv_cache_dtype: Literal["auto", "bf16", "bfloat16", "fp8_e4m3", "fp8_e5m2"] = "auto"
    tp_size: int = Field(1, ge=1, le=16)
    speculative_algorithm: Literal["EAGLE", "EAGLE3", "NEXTN"] | None = None
    speculative_num_steps: int | None = Field(None, ge=1, le=16)
    speculative_eagle_topk: int | None = Field(None, ge=1, le=16)
    speculative_num_draft_tokens: int | None = Field(None, ge=1, le=64)
    enable_metrics: bool = True
    extra_args: tuple[str, ...] = Field(
        (), description="further SGLang flags passed verbatim (argv items)")

    @model_validator(mode="after")
    def _check_combinations(self) -> ServerFlags:
        spec_fields = (self.speculative_num_steps, self.speculative_eagle_topk,
                       self.speculative_num_draft_tokens)
        if self.speculative_algorithm is None and any(v is not None for v in spec_fields):
            raise ValueError(
                "speculative_num_steps/eagle_topk/num_draft_tokens need speculative_algorithm "
                "(e.g. EAGLE)")
        if self.mamba_strategy == "no_buffer" and self.page_size not in (None, 1):
            raise ValueError("page_size: no_buffer requires page_size 1; drop page_size or "
                             "use extra_buffer")
        given = self._graph_max_bs_arg()
        if given is not None and not given[1].isdigit():
            raise ValueError(f"server.extra_args: --cuda-graph-max-bs takes a whole number, "
                             f"not {given[1]!r}")
        return self

    def _graph_max_bs_arg(self) -> tuple[int, str] | None:
        """(index in extra_args of the item holding the value, the value) of the decode
        CUDA-graph batch size, given as `--flag N` or `--flag=N`; None: not given."""
        args = self.extra_args
        for i, arg in enumerate(args):
            name, equals, value = arg.partition("=")
            if name in GRAPH_MAX_BS_FLAGS:
                if equals:
                    return i, value
                return (i + 1, args[i + 1]) if i + 1 < len(args) else (i, "")
        return None

    @property
    def graph_max_bs(self) -> int | None:
        """The largest decode batch SGLang captures a CUDA graph for, where extra_args give it
        (`--cuda-graph-max-bs`, or `--cuda-graph-max-bs-decode`); None: SGLang's default for
        the GPU. Larger batches run eager (its log: `cuda graph: False`)."""
        given = self._graph_max_bs_arg()
        return int(given[1]) if given is not None else None

    def with_graph_max_bs(self, batch: int) -> ServerFlags:
        """The same flags with the given CUDA-graph batch size (the user's spelling kept;
        `--cuda-graph-max-bs N` added where none was given)."""
        given = self._graph_max_bs_arg()
        if given is None:
            return self.with_changes(extra_args=(*self.extra_args, GRAPH_MAX_BS_FLAGS[0],
                                                 str(batch)))
        args = list(self.extra_args)
        at, value = given
        args[at] = args[at][:len(args[at]) - len(value)] + str(batch)
        return self.with_changes(extra_args=tuple(args))

    @property
    def speculative(self) -> bool:
        return self.speculative_algorithm is not None

    @property
    def draft_tokens(self) -> int:
        """D: SGLang forces num_draft_tokens = steps + 1 when topk == 1; Qwen auto = (3, 1, 4)."""
        if not self.speculative:
            return 0
        steps = self.speculative_num_steps or 3
        topk = self.speculative_eagle_topk or 1
        if topk == 1:
            return steps + 1
        return self.speculative_num_draft_tokens or steps + 1

    def fingerprint(self) -> str:
        """Stable short hash of the flags, used to key capacity measurements and ledgers."""
        blob = json.dumps(self.model_dump(mode="json"), sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    def with_changes(self, **changes: object) -> ServerFlags:
        """A validated copy with some flags changed."""
        return ServerFlags.model_validate({**self.model_dump(), **changes})
