"""Writes the chat additions of configs/smollm2-additions.toml: 400 training and 100 held-out
problems "What is a + b? Answer with just the number." with 1 <= a, b <= 49, in verl's layout
(JSONL). Held-out problems are disjoint from the training ones as unordered pairs, so a model
that learned 17 + 25 has not seen 25 + 17 either. Deterministic: the same files every time.

    python3 scripts/make_chat_additions.py configs/data
"""

import json
import random
import sys
from pathlib import Path

TRAIN, HELD_OUT = 400, 100


def row(a: int, b: int, index: int) -> dict:
    question = f"What is {a} + {b}? Answer with just the number."
    return {
        "prompt": [{"role": "user", "content": question}],
        "data_source": "chat_additions",
        "reward_model": {"ground_truth": str(a + b)},
        "extra_info": {"index": index},
    }


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "configs/data")
    rng = random.Random(0)
    pairs = [(a, b) for a in range(1, 50) for b in range(a, 50)]
    rng.shuffle(pairs)
    held_out, train = pairs[:HELD_OUT], pairs[HELD_OUT : HELD_OUT + TRAIN]
    out.mkdir(parents=True, exist_ok=True)
    for name, split in [("additions-train.jsonl", train), ("additions-held-out.jsonl", held_out)]:
        with open(out / name, "w") as f:
            for i, (a, b) in enumerate(split):
                if rng.random() < 0.5:
                    a, b = b, a
                f.write(json.dumps(row(a, b, i)) + "\n")
    print(f"wrote {len(train)} training and {len(held_out)} held-out problems to {out}")


if __name__ == "__main__":
    main()
