"""`plan` takes every flag the targeted SGLang release accepts, read from its source
(infra/sglang/release_flags.py): modelled ones as ServerFlags fields, the others carried."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infra.sglang.flag_parser import flag_names, parse_server_flags, unmodelled
from infra.sglang.flags import ServerFlags
from infra.sglang.release_flags import (
    FLAGS_FILE,
    extract_flags,
    flags_for,
    known_flags,
    read_server_args,
)
from infra.sglang.versions import parse_version

SOURCES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "sglang-source"
V0517 = parse_version("0.5.17")
LAUNCH_ONLY = {"--model-path", "--model", "--host", "--port", "--api-key", "--config"}


def test_the_committed_flag_tables_are_what_the_releases_source_says() -> None:
    on_file = json.loads(FLAGS_FILE.read_text())
    assert sorted(on_file) == ["0.5.15", "0.5.17"]
    for release in on_file:
        source = read_server_args(SOURCES / f"server_args-{release}.py.gz")
        assert extract_flags(source) == on_file[release]
    assert len(on_file["0.5.17"]) > 450


def test_every_servers_flag_field_is_a_flag_of_the_release() -> None:
    """A ServerFlags field named otherwise than SGLang names it would be a hand-kept
    spelling that disagrees with SGLang's own."""
    table = known_flags()["0.5.17"]
    for field in ServerFlags.model_fields:
        if field == "extra_args":
            continue
        assert any(name in table for name in flag_names(field)), field


def test_plan_takes_every_flag_of_0517() -> None:
    table = known_flags()["0.5.17"]
    fields = {n for f in ServerFlags.model_fields if f != "extra_args" for n in flag_names(f)}
    carried = 0
    for flag, takes in table.items():
        if flag in fields or flag in LAUNCH_ONLY:
            continue
        argv = [flag] + {"none": [], "one": ["8"], "many": ["1", "2"]}[takes]
        flags = parse_server_flags(argv, V0517)
        assert flags.extra_args == tuple(argv), flag
        carried += 1
    assert carried > 400


def test_unmodelled_flags_are_named_and_a_flag_the_release_lacks_is_refused() -> None:
    flags = parse_server_flags(["--moe-runner-backend", "triton", "--cuda-graph-max-bs=320",
                                "--enable-mixed-chunk", "--mem-fraction-static", "0.9"], V0517)
    assert flags.mem_fraction_static == 0.9 and flags.graph_max_bs == 320
    assert unmodelled(flags) == ["--moe-runner-backend", "--enable-mixed-chunk"]
    with pytest.raises(ValueError, match=r"--no-such-flag: not a flag SGLang 0\.5\.17 accepts"):
        parse_server_flags(["--no-such-flag", "1"], V0517)
    assert flags_for(parse_version("0.5.23")) == ("0.5.17", known_flags()["0.5.17"])
