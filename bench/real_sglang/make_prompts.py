"""Write N pre-tokenized prompts (`input_ids`) as JSONL: the input of the real-SGLang runs.

Random ids below the vocabulary size, a distinct sequence per row (no shared prefix, so the
radix cache does not hide prefill work). Standard library only: it runs on the GPU machine.
"""

from __future__ import annotations

import argparse
import json
import random


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rows", type=int, required=True)
    parser.add_argument("--input-len", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=240_000)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    rng = random.Random(17)
    with open(args.out, "w") as fh:
        for i in range(args.rows):
            ids = [rng.randrange(3, args.vocab) for _ in range(args.input_len)]
            fh.write(json.dumps({"id": f"p{i:06d}", "input_ids": ids}) + "\n")


if __name__ == "__main__":
    main()
