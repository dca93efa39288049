#!/usr/bin/env python3
"""An example skein reward worker: a math-answer reward, standard library only.

skein starts this once and keeps it running. It reads one JSON request per line on stdin:

    {"id": "...", "data_source": "...", "prompt": "...", "response": "...",
     "prompt_ids": [...], "response_ids": [...], "ground_truth": "...", "metadata": {...}}

and writes exactly one JSON line per request, in order, on stdout:

    {"id": "...", "reward": 1.0, "metrics": {"answer_found": 1.0}}
or  {"id": "...", "error": "what went wrong"}

Print diagnostics to stderr, never to stdout. Exit when stdin closes.

For tests: `--hang-every K` stops answering (sleeps, reading nothing more) at every K-th
request this process gets (1: at the first).
"""

import argparse
import json
import sys
import time
from fractions import Fraction


def last_boxed(text):
    """Content of the last \\boxed{...}, braces may nest."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth = 0
    for i in range(start + len("\\boxed"), len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start + len("\\boxed{"):i]
    return None


def final_answer(text):
    """A boxed answer, else the text after the last '####'."""
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed.strip()
    if "####" in text:
        tail = text.rsplit("####", 1)[1].strip().splitlines()
        return tail[0].strip() if tail else None
    return None


def as_number(answer):
    cleaned = answer.replace("$", "").replace(",", "").replace(" ", "").rstrip(".")
    try:
        return Fraction(cleaned)
    except (ValueError, ZeroDivisionError):
        return None


def score(request):
    answer = final_answer(request.get("response", ""))
    truth = request.get("ground_truth", "")
    reference = final_answer(truth) or truth.strip()
    if answer is None:
        return 0.0, 0.0
    a, b = as_number(answer), as_number(reference)
    same = a == b if a is not None and b is not None else answer == reference
    return (1.0 if same else 0.0), 1.0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hang-every", type=int, default=0, metavar="K")
    args = parser.parse_args()
    requests = 0
    for line in sys.stdin:
        if not line.strip():
            continue
        requests += 1
        if args.hang_every and requests % args.hang_every == 0:
            print(f"reward_worker_example: hanging at request {requests}", file=sys.stderr)
            time.sleep(3600)
        request_id = None
        try:
            request = json.loads(line)
            request_id = request.get("id")
            reward, found = score(request)
            answer = {"id": request_id, "reward": reward, "metrics": {"answer_found": found}}
        except Exception as e:  # one bad request must not take the worker down
            answer = {"id": request_id, "error": f"{type(e).__name__}: {e}"}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
