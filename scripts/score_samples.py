"""Scores the answers `skein eval --samples FILE` wrote under three readings of a chat model's
answer, to tell what RL changed in it: its format or its arithmetic.

- strict: the whole response is the number (what "Answer with just the number" asks);
- last number: the last number in the response (the flexible math reward);
- anywhere: some number in the response is the answer (the most lenient: the sum was
  computed, wherever it stands).

    python3 scripts/score_samples.py answers.jsonl
"""

import json
import re
import sys

NUMBER = re.compile(r"-?\d+")


def readings(response: str, truth: str) -> dict:
    numbers = NUMBER.findall(response)
    return {
        "strict": response.strip() == truth,
        "last number": bool(numbers) and numbers[-1] == truth,
        "anywhere": truth in numbers,
    }


def main() -> None:
    samples = [json.loads(line) for line in open(sys.argv[1])]
    if not samples:
        sys.exit(f"{sys.argv[1]}: no samples")
    totals: dict = {}
    for s in samples:
        for name, ok in readings(s["response"], s["ground_truth"].strip()).items():
            totals[name] = totals.get(name, 0) + ok
    line = {name: round(n / len(samples), 3) for name, n in totals.items()}
    line["samples"] = len(samples)
    print(json.dumps(line))


if __name__ == "__main__":
    main()
