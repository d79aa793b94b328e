"""What each SGLang version does differently, keyed by the upstream change dates.

The behaviour changes that matter to us (../shared/sglang-reference.md §1–2) happened on
upstream `main` on known dates; a release carries every change merged before it was cut.
Releases between two known cut dates are given the older behaviour (the safe side: the old
flag names are accepted by every build up to 0.5.22).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date

# Cut dates of releases we know (reference Appendix B; 0.5.23 from PyPI).
RELEASE_DATES: dict[tuple[int, int, int], date] = {
    (0, 4, 0): date(2024, 12, 6),
    (0, 5, 0): date(2025, 8, 11),
    (0, 5, 6): date(2025, 12, 8),
    (0, 5, 10): date(2026, 3, 28),
    (0, 5, 11): date(2026, 5, 8),
    (0, 5, 15): date(2026, 7, 7),
    (0, 5, 23): date(2026, 10, 20),
}

STRATEGY_FLAG_ADDED = date(2025, 12, 14)  # --mamba-scheduler-strategy (#14792)
JOINT_SPEC_SOLVE = date(2026, 5, 27)  # intermediate buffers solved with the slot count
MRR_TOKEN_CAP = date(2026, 6, 12)  # requested MRR capped by tokens/2, MTP KV scaling
STRATEGY_RENAMED = date(2026, 6, 19)  # --mamba-radix-cache-strategy (#28151)


@dataclass(frozen=True)
class SGLangVersion:
    """A resolved SGLang version and the behaviours it implies."""

    label: str
    release: date
    is_0523_or_newer: bool
    # The mamba pool's padding slot is counted in the slot solve and allocated: seen on
    # 0.5.17 (246 slots where the unpadded solve gives 247, bench/real_sglang/fit.py), and
    # in 0.5.23's source.
    pads_mamba_pool: bool = False
    # A running request's prefix state stays locked in the radix tree (one more live state
    # per request in `mamba num`): seen on 0.5.17, not in seed 000's older build.
    locks_prefix_state: bool = False
    # A breakable prefill CUDA graph is captured by default, and the default
    # mem_fraction_static reserves 8 MB per captured size for it: seen on 0.5.17 (0.903 on the
    # H200 for Falcon-H1, Granite and LFM2; 0.907 for Kimi-Linear, whose MLA turns it off).
    reserves_prefill_graph: bool = False
    # The release number (None for `main`): what the per-release tables are keyed by
    # (release_tables.py), since several releases share one known cut date.
    number: tuple[int, int, int] | None = None

    @property
    def strategy_flag(self) -> str | None:
        if self.release < STRATEGY_FLAG_ADDED:
            return None
        if self.release >= STRATEGY_RENAMED:
            return "--mamba-radix-cache-strategy"
        return "--mamba-scheduler-strategy"

    @property
    def auto_prefers_extra_buffer(self) -> bool:
        return self.release >= STRATEGY_RENAMED

    @property
    def no_buffer_needs_disable_overlap(self) -> bool:
        """New builds assert instead of silently disabling overlap for explicit no_buffer."""
        return self.release >= STRATEGY_RENAMED

    @property
    def spec_reservation(self) -> str:
        if self.pads_mamba_pool:
            return "joint_padded"
        return "joint" if self.release >= JOINT_SPEC_SOLVE else "upfront"

    @property
    def mrr_token_cap(self) -> bool:
        return self.release >= MRR_TOKEN_CAP

    @property
    def spec_without_radix_rejects_no_buffer(self) -> bool:
        """≤2026-06-18: speculative decoding + no_buffer + radix cache is a hard error."""
        return self.release < STRATEGY_RENAMED


_VERSION_RE = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)(?:[.\-+]?(?:post|rc|dev)\d*)?(?:\+.*)?$")


def parse_version(text: str) -> SGLangVersion:
    """Resolve `0.5.23`, `v0.5.10rc0`, `0.5.4.post1` or `main` to a behaviour set."""
    raw = text.strip()
    if raw.lower() in ("main", "latest"):
        return SGLangVersion("main", date(2026, 7, 20), is_0523_or_newer=False)
    match = _VERSION_RE.match(raw)
    if not match:
        raise ValueError(
            f"sglang_version: {text!r} is not a version like 0.5.23 (or 'main'); "
            "set it to the installed SGLang release"
        )
    key = (int(match[1]), int(match[2]), int(match[3]))
    known = [v for v in RELEASE_DATES if v <= key]
    if not known:
        raise ValueError(
            f"sglang_version: {raw} is older than the oldest release we model "
            f"({'.'.join(map(str, min(RELEASE_DATES)))}); upgrade SGLang"
        )
    release = RELEASE_DATES[max(known)]
    return SGLangVersion(raw, release, is_0523_or_newer=key >= (0, 5, 23),
                         pads_mamba_pool=key >= (0, 5, 17), locks_prefix_state=key >= (0, 5, 17),
                         reserves_prefill_graph=key >= (0, 5, 17), number=key)


def installed_version() -> SGLangVersion | None:
    """The SGLang installed in this environment, if any (read from package metadata)."""
    from importlib import metadata

    try:
        return parse_version(metadata.version("sglang"))
    except metadata.PackageNotFoundError:
        return None
