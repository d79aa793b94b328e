"""Does a primer's cut fall on a token boundary? (tasks/affinity.py:shared_prefix_row)

    pip install tokenizers   # not a dependency of the pipeline
    python bench/real_sglang/check_primer_cut.py .real-sglang/models/tiny-qwen3-next/tokenizer.json

Builds the input of `device.sh affinity` (groups of four prompts sharing a 700-word document),
cuts each group's primer from its first two prompts, and counts the prompts whose tokens start
with the primer's tokens — what a no_buffer server needs to resume from the primer's cached
state. For contrast, the same count for the raw common prefix (ending in "Question ").
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

from tokenizers import Tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from infra.prompt_row import PromptRow
from tasks.affinity import common_length, shared_prefix_row

WORDS = ("state cache request token batch decode prefill memory slot pool server shard plan "
         "queue mamba attention layer kernel graph prompt answer reason data train value").split()


def group(g: int) -> list[str]:
    rng = random.Random(g)
    doc = " ".join(rng.choice(WORDS) for _ in range(700))
    return [f"Document {g}: {doc}\n\nQuestion {k}: what does line {k} say about "
            f"{rng.choice(WORDS)}?" for k in range(4)]


def main() -> None:
    tok = Tokenizer.from_file(sys.argv[1])
    ids = lambda text: tok.encode(text, add_special_tokens=False).ids  # noqa: E731
    cut = raw = total = 0
    for g in range(int(sys.argv[2]) if len(sys.argv) > 2 else 200):
        prompts = group(g)
        row = shared_prefix_row(PromptRow(0, prompt=prompts[0]), PromptRow(1, prompt=prompts[1]))
        assert row is not None
        primer = ids(row.prompt or "")
        common = ids(prompts[0][:common_length(prompts[0], prompts[1])])
        for p in prompts:
            full = ids(p)
            cut += full[:len(primer)] == primer
            raw += full[:len(common)] == common
            total += 1
    print(f"primer cut: {cut} of {total} prompts start with its tokens; "
          f"raw common prefix: {raw} of {total}")


if __name__ == "__main__":
    main()
