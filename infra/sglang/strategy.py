"""The mamba radix-cache strategy and overlap schedule a hybrid model starts with, resolved the
way the targeted SGLang release resolves them.

0.5.15–0.5.23 (`srt/arg_groups/overrides.py::_mamba_radix_cache_resolution`, validated in
`srt/server_args.py::ServerArgs._handle_mamba_radix_cache`):

* An architecture in the release's radix-cache table (a Granite hybrid: one with a mamba
  layer) *uses* the mamba radix cache. Then `auto` becomes extra_buffer when the overlap
  schedule is on (or pages are > 1) and the architecture may run extra_buffer on the
  configured linear-attention backend (`supports_mamba_cache_extra_buffer`: in the
  extra_buffer table, backend triton); otherwise no_buffer, and the overlap schedule is
  turned off. An explicit extra_buffer that the support check refuses is SGLang's assertion
  "extra_buffer is not supported for {arch}; use no_buffer." (`_validate_mamba_extra_buffer`).
* Any other hybrid architecture (0.5.17's `Qwen3_5ForCausalLM` and `Qwen3_5MoeForCausalLM`,
  the text-only Qwen3.5/3.6 checkpoints) skips both: `auto` stays `auto`, which the memory
  pool reads as "not extra_buffer" (`ServerArgs.enable_mamba_extra_buffer`): no_buffer's 3
  slots a request with the overlap schedule left on; an explicit extra_buffer is taken
  unchecked. Measured on the H200 (docs/REAL_SGLANG.md, "two MoE hybrids"): the
  35B-A3B text shapes at default flags ran 480 slots / 3 = cap 160 with overlap on.

The tables themselves come from each release's source (release_tables.py). Releases from before
the strategy's rename resolve `auto` to no_buffer.
"""

from __future__ import annotations

from infra.sglang.flags import ServerFlags
from infra.sglang.launch import no_buffer_demands_overlap_off
from infra.sglang.release_tables import MambaCacheTables, known_tables, tables_for
from infra.sglang.shapes import ModelProfile
from infra.sglang.versions import SGLangVersion

# SGLang decides Granite hybrids by their layers, not the table (`_mamba_radix_cache_resolution`)
_BY_LAYER_TYPES = frozenset({"GraniteMoeHybridForCausalLM"})
DEFAULT_LINEAR_BACKEND = "triton"  # ServerArgs.linear_attn_backend's default


class StrategyRefused(ValueError):
    """SGLang would refuse the strategy at startup (its assertion's words)."""


def linear_attn_backend(flags: ServerFlags) -> str:
    """`--linear-attn-backend` where extra_args give it, else SGLang's default."""
    args = flags.extra_args
    for i, arg in enumerate(args):
        name, equals, value = arg.partition("=")
        if name == "--linear-attn-backend":
            return value if equals else (args[i + 1] if i + 1 < len(args) else "")
    return DEFAULT_LINEAR_BACKEND


def _tables(version: SGLangVersion) -> MambaCacheTables:
    """The release's tables; a release older than every extracted one is read with the
    oldest (the nearest source there is)."""
    found = tables_for(version)
    if found is not None:
        return found
    return min(known_tables().values(), key=lambda t: tuple(int(p) for p in t.release.split(".")))


def uses_radix_cache(model: ModelProfile, version: SGLangVersion) -> bool:
    if model.architecture in _BY_LAYER_TYPES:
        return model.hybrid
    return _tables(version).uses_radix_cache(model.architecture)


def resolve_strategy(model: ModelProfile, flags: ServerFlags,
                     version: SGLangVersion) -> tuple[str, bool]:
    """(strategy as the memory pool sizes it, overlap schedule on) — or StrategyRefused."""
    overlap = not flags.disable_overlap_schedule
    if not model.hybrid:
        return "none", overlap
    strategy = flags.mamba_strategy
    tables = _tables(version)
    supported = tables.supports_extra_buffer(model.architecture, linear_attn_backend(flags))
    if flags.disable_radix_cache:
        return ("no_buffer" if strategy == "auto" else strategy), overlap
    if not uses_radix_cache(model, version):
        if strategy == "no_buffer":
            overlap = False  # the launcher adds --disable-overlap-schedule with no_buffer
        return ("no_buffer" if strategy == "auto" else strategy), overlap
    if strategy == "auto":
        wants_extra = overlap or (flags.page_size or 1) > 1
        strategy = ("extra_buffer" if version.auto_prefers_extra_buffer and wants_extra
                    and supported else "no_buffer")
    if strategy.startswith("extra_buffer") and not supported:
        raise StrategyRefused(
            f"extra_buffer is not supported for {model.architecture}; use no_buffer "
            f"(SGLang {version.label}: supports_mamba_cache_extra_buffer, linear-attention "
            f"backend {linear_attn_backend(flags)})")
    if strategy == "no_buffer":
        overlap = False  # SGLang turns it off for auto; it demands it off for explicit
    return strategy, overlap


def launch_needs(model: ModelProfile, flags: ServerFlags, version: SGLangVersion) -> list[str]:
    """Flags SGLang demands at start-up that these flags leave out, each with why. The
    pipeline's launcher adds them (infra/sglang/launch.py); a launch line of the user's own
    must carry them: the overlap schedule's off switch for an explicit no_buffer on an
    architecture that uses the mamba radix cache (the launcher's own rule, which it applies
    to every architecture)."""
    if (model.hybrid and no_buffer_demands_overlap_off(flags, version)
            and not flags.disable_radix_cache and not flags.disable_overlap_schedule
            and uses_radix_cache(model, version)):
        return [f"--disable-overlap-schedule (SGLang {version.label} refuses an explicit "
                f"no_buffer on {model.architecture} without it: \"no_buffer do not support "
                "overlap schedule\")"]
    return []
