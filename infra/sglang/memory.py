"""SGLang's startup memory accounting for hybrid (Mamba/GDN + attention) and dense models.

One model for the planner (`expansion plan`), the tuning policy and the simulator, so the
simulator refuses, sizes and caps exactly where the planner predicts. Formulas follow
../shared/sglang-reference.md §2 (SGLang `kv_cache_configurator.py`, `memory_pool.py`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Literal

from infra.sglang import strategy
from infra.sglang.flags import ServerFlags
from infra.sglang.profiles import GIB, GpuProfile, ModelProfile
from infra.sglang.versions import SGLangVersion, parse_version

DEFAULT_VERSION = "0.5.23"
DEFAULT_MAMBA_FULL_MEMORY_RATIO = 0.9
SPEC_DEFAULT_MRR = 48

BindingLimit = Literal["mamba", "kv", "requested"]


class PoolsDoNotFit(ValueError):
    """The flags do not fit the GPU: SGLang would refuse to start with this message."""


@dataclass(frozen=True)
class MemoryPlan:
    """Everything SGLang decides at startup about pools and caps, plus why."""

    model: str
    gpu: str
    version: str
    mamba_strategy: str  # resolved: no_buffer | extra_buffer | extra_buffer_lazy | none
    overlap_schedule: bool
    mem_fraction_static: float
    weights_gib: float
    rest_gib: float
    per_slot_mib: float
    slot_ratio: int  # ρ: mamba slots per running request
    draft_tokens: int
    mamba_slots: int
    conv_state_gib: float
    ssm_state_gib: float
    intermediate_gib: float  # intermediate_ssm_state_cache (speculative decoding)
    intermediate_conv_gib: float
    kv_cache_gib: float
    kv_cell_bytes: int
    max_total_num_tokens: int
    requested_running_requests: int
    max_running_requests: int
    mamba_cap: int | None
    token_cap: int
    binding_limit: BindingLimit
    context_len: int
    chunked_prefill_size: int
    graph_max_bs: int
    warnings: tuple[str, ...]

    @property
    def graphs_cover_cap(self) -> bool:
        """Whether a full batch replays a CUDA graph; above `graph_max_bs` SGLang 0.5.17 runs
        eager: slower (72.7 ms against 37.8 ms a step at 313 running, Qwen3.6-35B-A3B on the
        H200), and the eager attention's buffers are not reserved (Kimi-Linear-48B-A3B died
        of CUDA OOM on its first batch above 256: docs/REAL_SGLANG.md, "two MoE hybrids")."""
        return self.max_running_requests <= self.graph_max_bs

    @property
    def pools_hold(self) -> int:
        """Running requests the pools would take were the requested cap out of the way: the
        mamba slots' bound and the scheduler's token bound."""
        return min(c for c in (self.mamba_cap, self.token_cap) if c is not None)

    def kv_holds(self, kv_per_request: int) -> int:
        """Running requests of `kv_per_request` KV tokens each the KV pool carries (≥ 1)."""
        return max(1, self.max_total_num_tokens // kv_per_request)

    def to_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["warnings"] = list(self.warnings)
        data["graphs_cover_cap"] = self.graphs_cover_cap
        return data


def covering_graphs(flags: ServerFlags, plan: MemoryPlan) -> ServerFlags | None:
    """The flags with decode CUDA graphs raised to the plan's cap, where it runs past them
    (None: the graphs already cover it)."""
    if plan.graphs_cover_cap:
        return None
    return flags.with_graph_max_bs(plan.max_running_requests)


def gpu_memory_defaults(gpu: GpuProfile) -> tuple[int, int]:
    """(chunked_prefill_size, decode CUDA-graph max bs) SGLang picks from GPU memory (TP<4)."""
    gib = gpu.total_mib / 1024
    if gib < 20:
        return 2048, 8
    if gib < 35:
        return 2048, 24
    if gib < 60:
        return 4096, 32
    if gib < 160:
        return 8192, 256
    return 16384, 512


def default_mem_fraction(gpu: GpuProfile, model: ModelProfile, flags: ServerFlags,
                         version: SGLangVersion) -> float:
    """SGLang's `_handle_gpu_memory_settings` heuristic (reserved MiB → fraction)."""
    chunked, graph_bs = gpu_memory_defaults(gpu)
    chunked = flags.chunked_prefill_size or chunked
    graph_bs = flags.graph_max_bs or graph_bs  # an explicit size is what the reserve uses
    reserved = 512 + 1.5 * max(chunked, 2048) + flags.tp_size / 8 * 1024 + 2 * graph_bs
    if version.reserves_prefill_graph and prefill_graph_captured(model):
        reserved += 8 * len(prefill_graph_sizes(chunked))
    if flags.speculative and not version.mrr_token_cap:
        reserved += 4 * 1024  # the April-era heuristic's EAGLE reserve
    if gpu.total_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    fraction = round((gpu.total_mib - reserved) / gpu.total_mib, 3)
    return round(fraction * model.vlm_mem_factor, 3)


def prefill_graph_captured(model: ModelProfile) -> bool:
    """Whether 0.5.17 captures a breakable prefill CUDA graph for this model: not for MLA,
    NemotronH or multimodal models (server_args.py: _disable_breakable_cudagraph_if_incompatible;
    multimodal ones unless allow-listed — left out here, as unmeasured)."""
    if model.mla_kv_dim or model.vlm_mem_factor != 1.0:
        return False
    return not model.architecture.startswith("NemotronH")


def prefill_graph_sizes(max_tokens: int) -> list[int]:
    """The token counts SGLang captures prefill graphs for (up to chunked_prefill_size)."""
    sizes = (list(range(4, 33, 4)) + list(range(48, 257, 16)) + list(range(288, 513, 32))
             + list(range(576, 1025, 64)) + list(range(1280, 4097, 256))
             + list(range(4608, max_tokens + 1, 512)))
    return [s for s in sizes if s <= max_tokens]


def resolve_strategy(model: ModelProfile, flags: ServerFlags,
                     version: SGLangVersion) -> tuple[str, bool]:
    """(strategy, overlap_on) as the release resolves them (strategy.py), or PoolsDoNotFit
    with SGLang's own refusal."""
    try:
        return strategy.resolve_strategy(model, flags, version)
    except strategy.StrategyRefused as exc:
        raise PoolsDoNotFit(str(exc)) from exc


def slot_ratio(strategy: str, overlap: bool, flags: ServerFlags) -> int:
    """ρ: how many mamba pool slots one running request needs (`_calculate_mamba_ratio`)."""
    if flags.disable_radix_cache:
        return 1
    if strategy == "extra_buffer":
        return 5 if overlap else 4
    if strategy == "extra_buffer_lazy":
        return 4
    return 3


def conv_dim_per_gpu(model: ModelProfile, flags: ServerFlags) -> int:
    """Conv channels of one linear layer on one GPU (n_groups padded to a multiple of TP)."""
    shape = model.mamba
    if shape is None:
        return 0
    groups = math.ceil(shape.n_groups / flags.tp_size) * flags.tp_size
    return (shape.num_heads * shape.head_dim + 2 * groups * shape.state_size) // flags.tp_size


def ssm_bytes_per_layer(model: ModelProfile, flags: ServerFlags) -> int:
    """One SSM state (one layer, one slot or one draft token) on one GPU."""
    shape = model.mamba
    if shape is None:
        return 0
    dtype = ({"bfloat16": 2, "float16": 2, "float32": 4}[flags.mamba_ssm_dtype]
             if flags.mamba_ssm_dtype else model.ssm_dtype_bytes)
    return (shape.num_heads // flags.tp_size) * shape.head_dim * shape.state_size * dtype


def per_slot_bytes(model: ModelProfile, flags: ServerFlags) -> tuple[int, int]:
    """(conv bytes, ssm bytes) of one mamba slot across all linear layers on one GPU."""
    if model.mamba is None:
        return 0, 0
    conv = (model.num_linear_layers * conv_dim_per_gpu(model, flags)
            * (model.mamba.conv_kernel - 1) * 2)
    return conv, model.num_linear_layers * ssm_bytes_per_layer(model, flags)


def kv_cell_bytes(model: ModelProfile, flags: ServerFlags, version: SGLangVersion) -> int:
    """Bytes of KV cache per token across the full-attention layers on one GPU."""
    dtype_bytes = 1 if flags.kv_cache_dtype.startswith("fp8") else 2
    full = model.num_full_layers
    if model.mla_kv_dim:  # MLA: one latent (kv_lora_rank + rope dims) per token, not per head
        return model.mla_kv_dim * full * dtype_bytes
    heads = max(1, model.num_kv_heads // flags.tp_size)
    cell = heads * (model.head_dim + model.v_head_dim) * full * dtype_bytes
    if flags.speculative and version.mrr_token_cap and model.draft_layers and full:
        cell = cell * (full + model.draft_layers) // full
    return cell


def plan_memory(model: ModelProfile, gpu: GpuProfile, flags: ServerFlags,
                version: SGLangVersion | str = DEFAULT_VERSION) -> MemoryPlan:
    """Size the pools and caps exactly as SGLang would at startup, or raise PoolsDoNotFit."""
    ver = parse_version(version) if isinstance(version, str) else version
    warnings: list[str] = []
    strategy, overlap = resolve_strategy(model, flags, ver)
    m = flags.mem_fraction_static or default_mem_fraction(gpu, model, flags, ver)
    chunked, graph_bs = gpu_memory_defaults(gpu)
    graph_bs = flags.graph_max_bs or graph_bs
    weights = model.weights_gib / flags.tp_size
    rest = _rest_after_weights(gpu, weights, m)
    requested = flags.max_running_requests
    if requested is None and flags.speculative:
        requested = SPEC_DEFAULT_MRR
        warnings.append("Max running requests is reset to 48 for speculative decoding.")
    ctx = flags.context_length or model.context_length
    if ctx > model.context_length:
        raise PoolsDoNotFit(
            f"context_length={ctx} exceeds the model's {model.context_length}; lower it")
    rho = slot_ratio(strategy, overlap, flags)
    conv_b, ssm_b = per_slot_bytes(model, flags)
    slots, kv_bytes = _split_rest(model, flags, ver, rest, requested, rho)
    cell = kv_cell_bytes(model, flags, ver)
    page = flags.page_size or 1
    tokens = math.floor(kv_bytes / cell) // page * page
    if flags.max_total_tokens:
        tokens = min(tokens, flags.max_total_tokens)
    if tokens < 2:
        raise PoolsDoNotFit(f"KV pool holds {tokens} tokens; raise mem_fraction_static")
    running, binding, request_cap, token_cap, mamba_cap = _caps(
        model, ver, _Pools(tokens, ctx, slots, rho), requested, warnings)
    inter_ssm, inter_conv = _intermediate_bytes(model, flags, running)
    alloc_slots = slots + 1
    return MemoryPlan(
        model=model.name, gpu=gpu.name, version=ver.label, mamba_strategy=strategy,
        overlap_schedule=overlap, mem_fraction_static=m, weights_gib=round(weights, 3),
        rest_gib=round(rest, 3), per_slot_mib=round((conv_b + ssm_b) / (1 << 20), 2),
        slot_ratio=rho, draft_tokens=flags.draft_tokens, mamba_slots=slots,
        conv_state_gib=round(alloc_slots * conv_b / GIB, 2) if model.hybrid else 0.0,
        ssm_state_gib=round(alloc_slots * ssm_b / GIB, 2) if model.hybrid else 0.0,
        intermediate_gib=round(inter_ssm / GIB, 2),
        intermediate_conv_gib=round(inter_conv / GIB, 2),
        kv_cache_gib=round(tokens * cell / GIB, 2), kv_cell_bytes=cell,
        max_total_num_tokens=tokens, requested_running_requests=request_cap,
        max_running_requests=running, mamba_cap=mamba_cap, token_cap=token_cap,
        binding_limit=binding, context_len=ctx, chunked_prefill_size=chunked,
        graph_max_bs=graph_bs, warnings=tuple(warnings),
    )


def _rest_after_weights(gpu: GpuProfile, weights: float, m: float) -> float:
    """GiB for the pools: free after the weights load, minus the unreserved share of what
    was free before it (reference §2.2)."""
    free_before = gpu.total_gib - gpu.context_gib
    free_after = free_before - weights
    rest = free_after - free_before * (1 - m)
    if rest <= 0:
        need = 1 - (free_after - 0.5) / free_before
        raise PoolsDoNotFit(
            f"mem_fraction_static={m:.3f} leaves no memory for pools after {weights:.1f} GiB of "
            f"weights on {gpu.name}; raise it to at least {min(need, 0.99):.3f} or use more TP")
    return rest


def _split_rest(model: ModelProfile, flags: ServerFlags, ver: SGLangVersion, rest: float,
                requested: int | None, rho: int) -> tuple[int, float]:
    """(mamba slots, bytes left for the KV pool) — the version's slot solve."""
    rest_bytes = rest * GIB
    if not model.hybrid:
        return 0, rest_bytes
    draft = flags.draft_tokens
    conv_b, ssm_b = per_slot_bytes(model, flags)
    p = conv_b + ssm_b
    ratio = flags.mamba_full_memory_ratio or DEFAULT_MAMBA_FULL_MEMORY_RATIO
    upfront = p * (requested or 0) * draft if ver.spec_reservation == "upfront" else 0.0
    if flags.max_mamba_cache_size:
        slots = flags.max_mamba_cache_size
        rest_bytes -= upfront
    elif flags.disable_radix_cache and requested:
        slots = requested
        rest_bytes -= upfront
    else:
        budget = rest_bytes * ratio / (1 + ratio)
        if ver.spec_reservation == "upfront":
            slots = math.floor((rest_bytes - upfront) * ratio / (1 + ratio) / p)
            rest_bytes -= upfront
        elif ver.spec_reservation == "joint":
            slots = math.floor(budget / (p * (1 + draft / rho)))
        else:
            slots = math.floor((budget - p * (1 + draft)) / (p * (1 + draft / rho)))
    if slots <= 0:
        raise PoolsDoNotFit(
            "Not enough GPU memory for hybrid (mamba/linear-attention) state cache: "
            f"{rest:.1f} GiB left after weights; raise mem_fraction_static or "
            "mamba_full_memory_ratio, or lower max_running_requests")
    intermediate_reserved = 0.0
    if draft and ver.spec_reservation != "upfront":
        base = min(requested or slots // rho, slots // rho)
        if ver.spec_reservation == "joint_padded":
            base += 1
        intermediate_reserved = p * base * draft
    pool_slots = slots + 1 if ver.pads_mamba_pool else slots
    kv_bytes = rest_bytes - pool_slots * p - intermediate_reserved
    if kv_bytes <= 0:
        raise PoolsDoNotFit(
            f"no memory left for the KV cache after {slots} mamba slots; lower "
            "max_mamba_cache_size or mamba_full_memory_ratio, or raise mem_fraction_static")
    return slots, kv_bytes


@dataclass(frozen=True)
class _Pools:
    """What the sized pools hold: KV tokens, the context length, mamba slots and the slots
    one request takes (the strategy's ratio)."""

    tokens: int
    context_len: int
    slots: int
    slot_ratio: int


def _caps(model: ModelProfile, ver: SGLangVersion, pools: _Pools, requested: int | None,
          warnings: list[str]) -> tuple[int, BindingLimit, int, int, int | None]:
    """(running cap, what binds it, request cap, KV cap, mamba cap), as the scheduler
    resolves max_running_requests."""
    tokens, ctx, slots, rho = pools.tokens, pools.context_len, pools.slots, pools.slot_ratio
    estimated = min(max(tokens * 512 // ctx, 2048), 4096)
    if requested is not None:
        request_cap = requested
        token_cap = tokens // 2 if ver.mrr_token_cap else estimated
    else:
        request_cap = estimated
        token_cap = tokens // 2
    mamba_cap = slots // rho if model.hybrid else None
    bounds: list[tuple[int, BindingLimit]] = [(request_cap, "requested"), (token_cap, "kv")]
    if mamba_cap is not None:
        bounds.append((mamba_cap, "mamba"))
    running, binding = min(bounds, key=lambda c: (c[0], c[1] != "requested"))
    if running <= 0:
        raise PoolsDoNotFit(
            f"max_running_requests resolves to {running} ({binding} pool too small); "
            "raise mem_fraction_static or the mamba share")
    if requested is not None and running < requested and ver.mrr_token_cap:
        warnings.append(
            f"max_running_requests was reduced from the requested {requested} to {running} "
            "(per dp worker) due to the available KV cache capacity.")
    return running, binding, request_cap, token_cap, mamba_cap


def _intermediate_bytes(model: ModelProfile, flags: ServerFlags,
                        running: int) -> tuple[float, float]:
    """Speculative decoding's intermediate SSM and conv-window caches, in bytes."""
    draft, shape = flags.draft_tokens, model.mamba
    if not draft or shape is None:
        return 0.0, 0.0
    rows = running + 1  # allocated for R+1 rows, sized by running requests, not slots
    inter_ssm = model.num_linear_layers * rows * draft * ssm_bytes_per_layer(model, flags)
    inter_conv = (model.num_linear_layers * rows * conv_dim_per_gpu(model, flags)
                  * (draft + shape.conv_kernel - 2) * 2)  # de-duplicated window layout
    return inter_ssm, inter_conv
