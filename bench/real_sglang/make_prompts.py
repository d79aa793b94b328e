"""Write N pre-tokenized prompts (`input_ids`) as JSONL: the input of the real-SGLang runs.

Random ids below the vocabulary size, a distinct sequence per row (no shared prefix, so the
radix cache does not hide prefill work). With `--out-mean M --out-p99 Q` each row also gets its
own `max_new_tokens`, drawn lognormal (clipped to `--out-max`), and prompt lengths uniform in
`--input-range LO HI`: a reasoning model's long, mixed outputs, which `ignore_eos` turns into
known lengths. Standard library only: it runs on the GPU machine.
"""

from __future__ import annotations

import argparse
import json
import math
import random


def lognormal(rng: random.Random, mean: float, p99: float, lo: int, hi: int) -> int:
    """One length of a lognormal with this mean and 99th percentile, clipped to [lo, hi]."""
    z99 = 2.3263
    sigma = z99 - math.sqrt(z99 * z99 - 2.0 * math.log(p99 / mean))
    return max(lo, min(hi, int(rng.lognormvariate(math.log(mean) - sigma * sigma / 2, sigma))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rows", type=int, required=True)
    parser.add_argument("--input-len", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=240_000)
    parser.add_argument("--input-range", type=int, nargs=2, metavar=("LO", "HI"))
    parser.add_argument("--out-mean", type=float)
    parser.add_argument("--out-p99", type=float)
    parser.add_argument("--out-max", type=int, default=8192)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    rng = random.Random(17)
    with open(args.out, "w") as fh:
        for i in range(args.rows):
            n = rng.randint(*args.input_range) if args.input_range else args.input_len
            row: dict[str, object] = {"id": f"p{i:06d}",
                                      "input_ids": [rng.randrange(3, args.vocab) for _ in range(n)]}
            if args.out_mean:
                row["max_new_tokens"] = lognormal(rng, args.out_mean, args.out_p99, 16,
                                                  args.out_max)
            fh.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
