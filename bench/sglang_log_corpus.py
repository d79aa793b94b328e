"""Build the log corpus by release: every scheduler line each SGLang release can print.

    python bench/sglang_log_corpus.py --wheels /tmp/sglw      # wheels from `pip download`
    python bench/sglang_log_corpus.py --wheels /tmp/sglw --write

A diagnosis of an older fleet reads that fleet's logs, so the parser (infra/sglang/observe.py)
is checked against what each release *prints*, read from that release's own source rather
than from memory: for every wheel, the functions that write the `Prefill batch` / `Decode
batch` lines (and the pool-usage parts newer releases build elsewhere) are parsed with `ast`,
their f-strings rendered with made-up numbers in each field's own format (`:.2f`, `%`,
booleans), and the fragments of one function joined into one line. A line therefore carries
every field its release can print there, once; what the parser must read back is the value
put in. The output, `tests/fixtures/sglang-log-corpus/lines.jsonl`, is checked in CI by
tests/unit/test_log_corpus.py, so CI needs neither the wheels nor the network.

Each printed label maps to a record key (LABEL_FIELDS) or is named as not read (NOT_READ,
with why); a label in neither stops the build, so a new release's new field is a decision,
not a silent gap.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import re
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from infra.sglang.observe import BATCH_LABELS, STARTUP_KEYS  # noqa: E402

OUT = ROOT / "tests" / "fixtures" / "sglang-log-corpus" / "lines.jsonl"

# the parser's own tables: a label the parser does not know must be named in NOT_READ
LABEL_FIELDS = {**BATCH_LABELS, **{key: key for key in STARTUP_KEYS}}
# what the parser reads for a label is the printed number times this (percent → fraction)
LABEL_SCALE = {"cache hit rate": 0.01}
_NOT_READ_GROUPS: dict[str, tuple[str, ...]] = {  # printed, not used by diagnosis or tuning
    "a flag the launch line already holds": ("max_prefill_tokens", "chunked_prefill_size"),
    "free memory after the pools: /server_info reports the pools": ("available_gpu_mem",),
    "PD disaggregation queues": (
        "#unbootstrapped-req", "#bootstrap-req", "#inflight-req", "#transferring-req",
        "#optimistic-req", "#prealloc-req", "#transfer-req", "pre-allocated usage",
        "#host-receive-req"),
    "the multimodal receiver's queue": ("waiting-image-req",),
    "speculative decoding detail beside accept len": ("cap len", "block accept len"),
    # the "est. …" labels: the parser splits at the ". " like any label
    "an estimate of SGLang's own, not a measurement": (
        "prefill TFLOPS/s (per GPU)", "decode TFLOPS/s (per GPU)", "read BW (GB/s per GPU)",
        "write BW (GB/s per GPU)", "fwd occupancy"),
    "hierarchical sparse attention's host and device pools": (
        "#cpu token", "#gpu token", "cpu token usage", "gpu token usage"),
    "scheduler internals": ("#reserved-decode-token", "#mamba", "largest-len", "time",
                            "#replay-token"),
    "LoRA adapters": ("#lora-slot", "lora usage"),
    "a rank tag inside the message (read as the rank)": ("device_id", "gpu_id"),
}
NOT_READ = {label: why for why, labels in _NOT_READ_GROUPS.items() for label in labels}
_HEADER = re.compile(r"(Prefill|Prefil|Decode) batch|max_total_num_tokens=")
_LABEL_AT_END = re.compile(r"(?:^|[,.(]\s*|\]\s*)(?P<label>[#A-Za-z(][^,:.=]*?)(?P<sep>: |=)$")
_EMPTY_NAMES = re.compile(r"(^|_)(msg|suffix|iter_msg)$")


def _value_for(release: str, label: str, spec: str, expr: str) -> tuple[str, object]:
    """A made-up number in the field's own format, and what a parser must read from it."""
    seed = int(hashlib.sha256(f"{release}|{label}".encode()).hexdigest()[:8], 16)
    if "graph" in label and not spec:
        return ("True", True) if seed % 2 else ("False", False)
    if spec.endswith("f"):
        digits = int(spec[1:-1] or 6)
        scale = (100.0 if "hit rate" in label or "occupancy" in label else
                 1.0 if "usage" in label or "rate" in label else
                 8.0 if "accept len" in label else 9000.0)
        value = round((seed % 10_000) / 10_000 * scale, digits)
        text = f"{value:.{digits}f}"
        return text, float(text)
    if spec:
        raise ValueError(f"{release}: format spec {spec!r} for {label!r} ({expr})")
    value = seed % 5000
    return str(value), value


def _spec(node: ast.FormattedValue) -> str:
    if node.format_spec is None:
        return ""
    assert isinstance(node.format_spec, ast.JoinedStr)
    return "".join(str(v.value) for v in node.format_spec.values if isinstance(v, ast.Constant))


def _label_text(node: ast.FormattedValue, source: str) -> str:
    """A label that is itself an expression: `'cpu graph' if … else 'cuda graph'`, the graph
    backend's name, `'available_cpu_mem' if … else 'available_gpu_mem'`: the GPU's."""
    text = ast.get_source_segment(source, node.value) or ""
    if isinstance(node.value, ast.IfExp):  # the GPU's branch, wherever the release put it
        branches = [b.value for b in (node.value.body, node.value.orelse)
                    if isinstance(b, ast.Constant)]
        for branch in branches:
            if "cuda" in str(branch) or "gpu" in str(branch):
                return str(branch)
    if "graph" in text:
        return "cuda graph"
    raise ValueError(f"an expression as a label: {text}")


def render(release: str, joined: ast.JoinedStr, source: str, fields: dict) -> str:
    """The f-string as SGLang prints it, each field a made-up value recorded in `fields`."""
    out = ""
    parts = joined.values
    for i, part in enumerate(parts):
        if isinstance(part, ast.Constant):
            out += str(part.value)
            continue
        assert isinstance(part, ast.FormattedValue)
        expr = ast.get_source_segment(source, part.value) or ""
        following = parts[i + 1] if i + 1 < len(parts) else None
        if out.endswith("batch ["):  # the forward counter some releases print
            out += str(_value_for(release, "forward_ct", "", expr)[1])
            continue
        label_next = isinstance(following, ast.Constant) and (
            str(following.value).startswith((": ", "=")))
        if label_next and (out.endswith((", ", ". ")) or out == ""):
            out += _label_text(part, source)
            continue
        if _EMPTY_NAMES.search(expr.split(".")[-1]) or expr.startswith("'"):
            continue  # a message piece built elsewhere (its fragments are in the corpus line)
        found = _LABEL_AT_END.search(out)
        if found is None:
            if "gpu_id" in expr:
                out += "0"
                continue
            raise ValueError(f"{release}: no label before {{{expr}}} in {out!r}")
        # 0.2-0.3 headers: "Prefill batch(mixed #running-req: N)"
        label = found["label"].split("(mixed ")[-1].strip()
        text, value = _value_for(release, label, _spec(part), expr)
        fields.setdefault(label, value)  # same release and label: the same made-up value
        out += text
    return out


def _message_functions(tree: ast.AST) -> list[ast.FunctionDef]:
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef):
            continue
        if "usage_msg_parts" in node.name:
            found.append(node)
            continue
        for sub in ast.walk(node):
            if isinstance(sub, ast.Constant) and isinstance(sub.value, str) \
                    and _HEADER.search(sub.value):
                found.append(node)
                break
    return found


def _fragments(func: ast.FunctionDef) -> list[ast.JoinedStr]:
    strs = [n for n in ast.walk(func) if isinstance(n, ast.JoinedStr)]
    inner = {id(v) for s in strs for v in ast.walk(s) if v is not s}
    return sorted((s for s in strs if id(s) not in inner), key=lambda s: (s.lineno, s.col_offset))


def _kind(text: str) -> str:
    return "startup" if text.startswith("max_total") else (
        "decode" if "Decode" in text.split("batch")[0] else "prefill")


def release_lines(release: str, files: dict[str, str]) -> tuple[list[dict], list[str]]:
    """The corpus lines of one release, and the fragments left out (for review)."""
    usage: dict[str, list[str]] = {"prefill": [], "decode": []}
    usage_fields: dict[str, dict] = {"prefill": {}, "decode": {}}
    lines, skipped = [], []
    starts: list[tuple[str, str, dict, list[str]]] = []
    for path, source in files.items():
        for func in _message_functions(ast.parse(source)):
            fields: dict = {}
            heads, extras = [], []
            for frag in _fragments(func):
                first = "".join(str(v.value) for v in frag.values if isinstance(v, ast.Constant))
                try:
                    text = render(release, frag, source, fields)
                except ValueError as err:
                    skipped.append(f"{path}:{frag.lineno}: {err}")
                    continue
                header = _HEADER.search(first)
                if header and header.group(0).startswith("max_total") \
                        and not first.startswith("max_total"):
                    header = None  # a memory-check message that names the pool size
                if header:
                    heads.append(text[text.index(header.group(0)):].rstrip(", "))
                elif ": " in text:
                    extras.append(text.strip(", "))
            if "usage_msg_parts" in func.name:
                for kind in ("prefill", "decode"):
                    if kind in func.name or not any(k in func.name for k in usage):
                        usage[kind].extend(extras)
                        usage_fields[kind].update(fields)
                continue
            starts.extend((path, head, fields, extras) for head in heads)
    for path, head, fields, extras in starts:
        kind = _kind(head)
        parts = [head] if kind == "startup" else [head, *usage[kind], *extras]
        text = ", ".join(p for p in parts if p)
        known = {**usage_fields.get(kind, {}), **fields}
        expected = {label: value for label, value in known.items() if f"{label}: " in text
                    or f"{label}=" in text}
        lines.append({"release": release, "kind": kind, "source": path,
                      "line": f"[2025-01-01 12:00:00 TP0] {text}", "fields": expected})
    return lines, skipped


def wheel_sources(wheel: Path) -> dict[str, str]:
    with zipfile.ZipFile(wheel) as zf:
        names = [n for n in zf.namelist() if n.endswith(".py") and "/srt/" in n
                 and any(f"/{d}/" in n for d in ("managers", "mem_cache", "observability"))]
        texts = {n: zf.read(n).decode("utf-8", "replace") for n in names}
    return {n: t for n, t in texts.items()
            if _HEADER.search(t) or "usage_msg_parts" in t}


def release_of(wheel: Path) -> str:
    return wheel.name.split("-")[1]


def check_labels(lines: list[dict]) -> list[str]:
    """Labels neither read nor named as not read: each one a decision still to make."""
    return sorted({f"{ln['release']}: {label}" for ln in lines for label in ln["fields"]
                   if label not in LABEL_FIELDS and label not in NOT_READ})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wheels", type=Path, required=True, help="folder of sglang-*.whl")
    ap.add_argument("--write", action="store_true", help=f"write {OUT.relative_to(ROOT)}")
    args = ap.parse_args()
    corpus, skipped = [], []
    for wheel in sorted(args.wheels.glob("sglang-*.whl")):
        lines, left = release_lines(release_of(wheel), wheel_sources(wheel))
        corpus += lines
        skipped += [f"{release_of(wheel)} {s}" for s in left]
        print(f"{release_of(wheel)}: {len(lines)} lines "
              f"({', '.join(sorted({ln['kind'] for ln in lines}))})")
    for s in skipped:
        print("left out:", s)
    unknown = check_labels(corpus)
    if unknown:
        print("labels neither in LABEL_FIELDS nor NOT_READ:\n  " + "\n  ".join(unknown))
        return 1
    if args.write:
        OUT.parent.mkdir(parents=True, exist_ok=True)
        OUT.write_text("".join(json.dumps(ln, sort_keys=True) + "\n" for ln in corpus))
        print(f"wrote {len(corpus)} lines to {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
