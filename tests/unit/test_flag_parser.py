"""The flag parser is generated from ServerFlags and agrees with the launcher both ways."""

from __future__ import annotations

import pytest

from infra.sglang.flag_parser import parse_server_flags
from infra.sglang.flags import ServerFlags
from infra.sglang.launch import server_args
from infra.sglang.versions import parse_version

FLAGS = [
    ServerFlags(),
    ServerFlags(mem_fraction_static=0.9, mamba_strategy="extra_buffer",
                mamba_full_memory_ratio=0.3, max_running_requests=256,
                max_mamba_cache_size=600, max_total_tokens=400000, page_size=1),
    ServerFlags(mamba_strategy="extra_buffer", speculative_algorithm="EAGLE",
                speculative_num_steps=3, speculative_eagle_topk=1,
                speculative_num_draft_tokens=4, kv_cache_dtype="fp8_e4m3", tp_size=2,
                disable_radix_cache=True, context_length=32768, mamba_ssm_dtype="bfloat16"),
]


@pytest.mark.parametrize("flags", FLAGS)
def test_what_the_launcher_writes_parses_back_to_the_same_flags(flags: ServerFlags) -> None:
    argv = server_args(flags, parse_version("0.5.17"), model="m", host="h", port=1,
                       api_key=None)
    assert parse_server_flags(argv) == flags


def test_old_and_new_names_of_a_renamed_flag_both_parse() -> None:
    old = parse_server_flags(["--mamba-scheduler-strategy", "no_buffer"])
    new = parse_server_flags(["--mamba-radix-cache-strategy", "no_buffer"])
    assert old == new == ServerFlags(mamba_strategy="no_buffer")
    # `expansion run --mamba-strategy` works in `expansion plan` too
    assert parse_server_flags(["--mamba-strategy", "no_buffer"]) == new


def test_every_server_flags_field_is_a_flag() -> None:
    """A field added to ServerFlags is parseable without touching a parser."""
    from infra.sglang.flag_parser import NOT_FLAGS, flag_names

    for name in ServerFlags.model_fields.keys() - NOT_FLAGS:
        assert flag_names(name)[0].startswith("--")
    assert parse_server_flags(["--chunked-prefill-size", "4096"]).chunked_prefill_size == 4096


@pytest.mark.parametrize(("argv", "named"), [
    (["--no-such-flag", "1"], "--no-such-flag"),
    (["--mamba-radix-cache-strategy", "fast"], "--mamba-radix-cache-strategy"),
    (["--max-running-requests", "many"], "--max-running-requests"),
    (["--mem-fraction", "0.9"], "--mem-fraction: not a server flag"),  # no abbreviations
])
def test_a_bad_flag_is_an_error_naming_it(argv: list[str], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        parse_server_flags(argv)
