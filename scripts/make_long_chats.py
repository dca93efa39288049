"""Writes chat JSONL of long conversations for measuring `skein sft`'s memory: 32
conversations of a 350-word user turn and a 600-word reply drawn from a small vocabulary
(about 980 SmolLM2 tokens each with its chat template). Deterministic.

    python3 scripts/make_long_chats.py /tmp/long.jsonl
"""

import json
import random
import sys

WORDS = "the a model answer number sum add carry digit result step first then next value".split()


def main(path: str) -> None:
    rng = random.Random(0)
    with open(path, "w") as f:
        for _ in range(32):
            user = " ".join(rng.choice(WORDS) for _ in range(350))
            reply = " ".join(rng.choice(WORDS) for _ in range(600))
            messages = [
                {"role": "user", "content": user},
                {"role": "assistant", "content": reply},
            ]
            f.write(json.dumps({"messages": messages}) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
