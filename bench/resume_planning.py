"""Resume planning at scale: 10M prompts with 9M committed, and client RSS vs input size.

    python bench/resume_planning.py [--rows 10000000] [--repeats 3]

Each measurement runs in a fresh subprocess so peak RSS (ru_maxrss) is its own. Prints a
markdown table and one JSON line at the end.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SHARD = 1000


def make_input(path: Path, rows: int) -> None:
    import polars as pl

    ids = pl.int_range(0, rows, eager=True).cast(pl.String)
    frame = pl.DataFrame({"id": "p" + ids, "prompt": "Explain topic number " + ids +
                          " to a curious student in detail, with examples."})
    frame.write_parquet(path)


def fake_commits(out: Path, prompts: Path, committed_rows: int) -> None:
    """Write plan + manifest lines for the first `committed_rows` rows (no shard files needed
    for planning: the manifest is the manifest)."""
    from infra.manifest import Manifest, make_plan
    from infra.prompts import validate_input

    manifest = Manifest(out)
    plan = manifest.init_plan(make_plan(validate_input(prompts), SHARD))
    with open(manifest.manifest_path, "w") as fh:
        for shard in range(committed_rows // SHARD):
            fh.write(json.dumps({
                "shard": shard, "rows": SHARD, "errors": 0, "first_id": "a", "last_id": "b",
                "sha256": "0" * 64, "path": f"shards/shard-{shard:06d}.parquet",
                "error_path": None, "output_tokens": 1, "plan": plan.fingerprint,
                "committed_at": 0.0}) + "\n")


def peak_rss_mb() -> float:
    """VmHWM of this process (ru_maxrss would carry the parent's peak across exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def child(mode: str, prompts: str, out: str) -> None:
    from infra.manifest import Manifest
    from tasks.shards import iter_pending_shards, prepare_job

    t0 = time.perf_counter()
    if mode == "plan":
        Manifest(Path(out)).remove_strays = lambda: []  # type: ignore[method-assign]
        state = prepare_job(Path(prompts), Path(out), SHARD)
        result: dict[str, float] = {"pending": len(state.pending)}
    elif mode == "validate":
        from infra.prompts import validate_input

        result = {"rows": validate_input(Path(prompts)).rows}
    else:  # stream every row of the input the way the dispatcher receives it
        import polars as pl

        from infra.manifest import make_plan
        from infra.prompts import InputSummary

        rows = pl.scan_parquet(prompts).select(pl.len()).collect().item()
        plan = make_plan(InputSummary(prompts, "parquet", rows, "prompt", "-"), SHARD)
        n = sum(len(rows) for _, rows in iter_pending_shards(plan, list(range(plan.num_shards))))
        result = {"rows": n}
    result["seconds"] = time.perf_counter() - t0
    result["peak_rss_mb"] = peak_rss_mb()
    print(json.dumps(result))


def measure(mode: str, prompts: Path, out: Path, repeats: int) -> dict[str, float]:
    runs = []
    for _ in range(repeats):
        proc = subprocess.run([sys.executable, __file__, "--child", mode, str(prompts),
                               str(out)], capture_output=True, text=True, check=True, cwd=ROOT)
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return {"seconds": statistics.median(r["seconds"] for r in runs),
            "peak_rss_mb": statistics.median(r["peak_rss_mb"] for r in runs)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--child", nargs=3)
    args = ap.parse_args()
    if args.child:
        child(*args.child)
        return
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        big, small = root / "big.parquet", root / "small.parquet"
        make_input(big, args.rows)
        make_input(small, args.rows // 10)
        fake_commits(root / "out", big, args.rows * 9 // 10)
        plan = measure("plan", big, root / "out", args.repeats)
        valid_small = measure("validate", small, root / "o2", args.repeats)
        valid_big = measure("validate", big, root / "o3", args.repeats)
        stream_small = measure("stream", small, root / "o2", args.repeats)
        stream_big = measure("stream", big, root / "o3", args.repeats)
    print("| measurement | median s | median peak RSS MiB |")
    print("|---|---|---|")
    print(f"| resume planning, {args.rows:,} prompts, 90% committed | {plan['seconds']:.2f} | "
          f"{plan['peak_rss_mb']:.0f} |")
    print(f"| validate input (ids), {args.rows // 10:,} prompts | {valid_small['seconds']:.2f} | "
          f"{valid_small['peak_rss_mb']:.0f} |")
    print(f"| validate input (ids), {args.rows:,} prompts | {valid_big['seconds']:.2f} | "
          f"{valid_big['peak_rss_mb']:.0f} |")
    print(f"| stream all rows, {args.rows // 10:,} prompts | {stream_small['seconds']:.2f} | "
          f"{stream_small['peak_rss_mb']:.0f} |")
    print(f"| stream all rows, {args.rows:,} prompts | {stream_big['seconds']:.2f} | "
          f"{stream_big['peak_rss_mb']:.0f} |")
    print(json.dumps({"resume_plan_s": round(plan["seconds"], 2),
                      "resume_plan_rss_mb": round(plan["peak_rss_mb"]),
                      "stream_rss_ratio_10x_input": round(
                          stream_big["peak_rss_mb"] / stream_small["peak_rss_mb"], 2)}))


if __name__ == "__main__":
    main()
