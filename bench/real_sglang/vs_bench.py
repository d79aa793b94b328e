"""The pipeline against SGLang's own benchmark on the same server, prompts and concurrency (#29).

Device side (device.sh `vsbench`). One job TOML fixes the server: its argv is built by the
pipeline's own launcher (`tasks.servers.build_launch_specs`), so both runs start the same
server. First `python -m sglang.benchmark.serving` (random-ids, token ids sent as
`input_ids`, `--max-concurrency C`, request rate inf) runs against that server; then the same
prompts — rebuilt from the benchmark's seed exactly as its random-ids dataset draws them —
go through `expansion run` with `client.concurrency_per_server = C` and tuning off. The figure
compared is output tokens per second while generating: the benchmark's `output_throughput`
(its duration runs from the first request to the last answer) against the pipeline's
`output_tokens / generating_s` (from the first shard handed to the dispatcher to the last
commit), so neither side's server start-up counts. One JSON line on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any


def bench_rows(n: int, input_len: int, output_len: int, ratio: float, vocab: int,
               seed: int) -> list[dict[str, Any]]:
    """The rows `sglang.benchmark.serving --dataset-name random-ids --tokenize-prompt` sends:
    the same draws in the same order (datasets/random.py, common.compute_random_lens)."""
    import numpy as np

    np.random.seed(seed)
    lens_in = np.random.randint(max(int(input_len * ratio), 1), input_len + 1, size=n).tolist()
    lens_out = np.random.randint(max(int(output_len * ratio), 1), output_len + 1,
                                 size=n).tolist()
    offsets = np.random.randint(0, vocab, size=n)
    return [{"id": f"b{i:06d}",
             "input_ids": [int((offsets[i] + i + j) % vocab) for j in range(lens_in[i])],
             "max_new_tokens": int(lens_out[i])} for i in range(n)]


# SGLang's benchmark client imports every dataset module, MMMU's with HF `datasets`, which the
# device's runtime lacks; aiohttp and tqdm it needs come as wheels (.whlx/bench, unpacked by
# device.sh into /tmp/benchdeps), requests from the pipeline's deps. The random-ids dataset
# uses none of `datasets`: its one name raises if anything calls it.
BENCHMARK_BOOT = """
import runpy, sys, types
sys.path += ["/tmp/benchdeps", "/tmp/expdeps"]
def _absent(*a, **k):
    raise RuntimeError("HF datasets is not installed on the device: use a random dataset")
sys.modules.setdefault("datasets", types.ModuleType("datasets")).load_dataset = _absent
sys.argv[0] = "sglang.benchmark.serving"
runpy.run_module("sglang.benchmark.serving", run_name="__main__", alter_sys=True)
"""


def wait_healthy(url: str, timeout_s: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
                if r.status == 200:
                    return time.monotonic() - t0
        except OSError:
            pass
        time.sleep(2)
    raise SystemExit(f"server at {url} not healthy within {timeout_s:.0f} s")


def run_benchmark(args: argparse.Namespace, settings: Any, out: Path) -> dict[str, Any]:
    from tasks.engines import build_engine

    spec = build_engine(settings).launch_specs(settings.server, out / "bench-server", 1)[0]
    env = {**os.environ, **spec.env}
    with open(out / "bench-server.log", "w") as log:
        proc = subprocess.Popen(spec.argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            return _serving_benchmark(args, settings, spec.port, env, out)
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(60)


def _serving_benchmark(args: argparse.Namespace, settings: Any, port: int,
                       env: dict[str, str], out: Path) -> dict[str, Any]:
    up = wait_healthy(f"http://127.0.0.1:{port}", 500)
    print(f"benchmark's server healthy after {up:.0f} s", file=sys.stderr, flush=True)
    result = out / "bench.jsonl"
    cmd = [args.python, "-c", BENCHMARK_BOOT, "--backend", "sglang",
           "--host", "127.0.0.1", "--port", str(port),
           "--dataset-name", "random-ids", "--tokenize-prompt",
           "--model", settings.model, "--tokenizer", settings.model,
           "--num-prompts", str(args.rows), "--random-input-len", str(args.input_len),
           "--random-output-len", str(args.output_len),
           "--random-range-ratio", str(args.ratio), "--max-concurrency", str(args.conc),
           "--request-rate", "inf", "--seed", str(args.seed), "--output-file", str(result),
           "--disable-tqdm"]
    with open(out / "bench.log", "w") as fh:
        subprocess.run(cmd, check=True, stdout=fh, stderr=subprocess.STDOUT, env=env)
    return dict(json.loads(result.read_text().splitlines()[-1]))


def run_pipeline(args: argparse.Namespace, rows: list[dict[str, Any]], out: Path) -> dict[str, Any]:
    prompts = out / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    target = out / "pipeline"
    cmd = [sys.executable, "-m", "expansion.cli", "run", "--config", args.config,
           "--prompts", str(prompts), "--output", str(target), "--set", f"python={args.python}",
           "--set", f"client.concurrency_per_server={args.conc}",
           "--set", "tuning.enabled=false"]
    with open(out / "pipeline.log", "w") as fh:
        subprocess.run(cmd, check=True, stdout=fh, stderr=subprocess.STDOUT)
    return json.loads((target / "summary.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--rows", type=int, required=True)
    parser.add_argument("--input-len", type=int, required=True)
    parser.add_argument("--output-len", type=int, required=True)
    parser.add_argument("--ratio", type=float, default=1.0)
    parser.add_argument("--conc", type=int, required=True)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--python", default="/tmp/sglpy")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    from infra.settings import load_settings

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    settings = load_settings(args.config, python=args.python)
    vocab = int(subprocess.run(
        [args.python, "-c", "import sys; from transformers import AutoTokenizer as T; "
         "print(T.from_pretrained(sys.argv[1]).vocab_size)", settings.model],
        check=True, capture_output=True, text=True).stdout.split()[-1])
    rows = bench_rows(args.rows, args.input_len, args.output_len, args.ratio, vocab, args.seed)
    bench = run_benchmark(args, settings, out)
    summary = run_pipeline(args, rows, out)
    pipe_tok_s = summary["output_tokens"] / summary["generating_s"]
    print(json.dumps({
        "name": args.name, "rows": args.rows, "concurrency": args.conc,
        "input_tokens_bench": bench["total_input_tokens"],
        "input_tokens_pipeline": sum(len(r["input_ids"]) for r in rows),
        "output_tokens_bench": bench["total_output_tokens"],
        "output_tokens_pipeline": summary["output_tokens"],
        "bench_output_tok_s": round(bench["output_throughput"], 1),
        "bench_duration_s": round(bench["duration"], 2),
        "pipeline_output_tok_s": round(pipe_tok_s, 1),
        "pipeline_generating_s": summary["generating_s"],
        "pipeline_startup_s": summary["startup_s"], "pipeline_wall_s": summary["seconds"],
        "ratio": round(pipe_tok_s / bench["output_throughput"], 4)}))


if __name__ == "__main__":
    main()
