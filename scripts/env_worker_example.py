#!/usr/bin/env python3
"""An example skein environment worker: the guessing game, standard library only.

Train on it with

    skein train --set agent.kind='"env-worker"' \
        --set agent.command='["python3", "scripts/env_worker_example.py"]' --set agent.workers=2

skein starts this program `agent.workers` times and keeps each running; one process hosts
many episodes at once, told apart by their episode id. It reads one JSON request per line on
stdin and writes one JSON answer per line on stdout, in order (except `close`, which gets no
answer). Every request that gets an answer carries an "id", and its answer echoes it: an answer
with another id fails its episode, and skein starts the process again.

    {"op": "info", "id": 1}
      -> {"name", "alphabet", "max_turns", "max_message_chars", "problems", "demonstrations"}
    {"op": "reset", "id": 2, "episode": ID, "task": {"seed": N, "split": "train" | "eval"}}
      -> {"id": 2, "messages": [{"role": "user", "content": "guess 1-16"}], "state": ""}
    {"op": "step", "id": 3, "episode": ID, "message": "8"}
      -> {"id": 3, "messages": [{"role": "user", "content": "higher"}], "reward": null,
          "done": false, "state": "8> "}
      or {"id": 3, "done": true, "reward": 1.0, "correct": true, "formatted": true}
    {"op": "demonstrate", "id": 4, "task": {...}, "transcript": [{"message", "reply"}, ...],
     "seed": N}
      -> {"id": 4, "message": "8"}
    {"op": "close", "episode": ID}   (no answer: forget the episode)

Any request may be answered {"id": ..., "error": "..."}: that episode fails and the others go on. A
reset must be deterministic in its seed: the episodes of a group share one seed, and are
compared with each other. "state" is optional: a key naming the state the next message is
written in (here the guesses and replies so far); episodes of a group in the same state are
compared turn by turn with `algorithm.step_group_weight`. Print diagnostics to stderr, never to stdout. Exit when stdin closes.

The game (the same as skein's built-in `guess`): the secret is uniform in 1..=N (N = 16, 64,
256 at difficulty 1, 2, 3); each message is a number; the answer is `higher` or `lower`, or
`1-N?` for a message that is not a number in range; the episode ends when the guess is right,
with reward 1 for a first-turn hit and 0.1 less per further turn, never below 0.1.

skein sets SKEIN_WORKER to the process's index (0 to agent.workers - 1).

For tests: `--crash-every K` exits abruptly instead of answering every K-th step this process
gets; `--hang-every K` stops answering (sleeps, reading nothing more) at every K-th step;
`--answer-twice-every K` writes every K-th step's answer twice; `--fault-worker I` limits
them to the process whose SKEIN_WORKER is I; `--slow-ms MS` waits MS milliseconds before
each reset or step answer; `--error-every K` answers every K-th reset with an error.
"""

import argparse
import json
import os
import random
import sys
import time

ALPHABET = "0123456789 -?\nseughirlow"
TURN_COST = 0.1
MIN_REWARD = 0.1


def largest(difficulty):
    return {1: 16, 2: 64}.get(difficulty, 256)


def reward_for(turns):
    return max(1.0 - TURN_COST * (turns - 1), MIN_REWARD)


def parse_guess(message):
    """The message as a number: trimmed, ASCII digits only, at most 9 of them."""
    text = message.strip()
    if not text or len(text) > 9 or not all("0" <= c <= "9" for c in text):
        return None
    return int(text)


def user(content):
    return {"role": "user", "content": content}


class Game:
    def __init__(self, difficulty):
        self.n = largest(difficulty)
        self.episodes = {}  # id -> {"secret", "turns", "formatted"}

    def info(self):
        return {
            "name": "guess",
            "alphabet": ALPHABET,
            # ceil(log2 N) + 2: binary search plus slack.
            "max_turns": self.n.bit_length() - 1 + 2,
            "max_message_chars": len(str(self.n)),
            "problems": self.n,
            "demonstrations": True,
        }

    def secret(self, task):
        return random.Random(int(task["seed"])).randint(1, self.n)

    def reset(self, episode, task):
        self.episodes[episode] = {"secret": self.secret(task), "turns": 0, "formatted": True,
                                  "history": ""}
        return {"messages": [user(f"guess 1-{self.n}")], "state": ""}

    def step(self, episode, message):
        state = self.episodes.get(episode)
        if state is None:
            raise KeyError(f"unknown episode {episode!r}")
        state["turns"] += 1
        guess = parse_guess(message)
        if guess is None or not 1 <= guess <= self.n:
            state["formatted"] = False
            state["history"] += "? "
            return {"messages": [user(f"1-{self.n}?")], "reward": None, "done": False,
                    "state": state["history"]}
        if guess == state["secret"]:
            del self.episodes[episode]
            return {"done": True, "reward": reward_for(state["turns"]), "correct": True,
                    "formatted": state["formatted"]}
        reply = "higher" if guess < state["secret"] else "lower"
        state["history"] += f"{guess}{'>' if reply == 'higher' else '<'} "
        return {"messages": [user(reply)], "reward": None, "done": False,
                "state": state["history"]}

    def demonstrate(self, transcript, seed):
        """Binary search: the midpoint half the time, else a point of the middle half."""
        lo, hi = 1, self.n
        for turn in transcript:
            guess = parse_guess(turn["message"])
            if guess is None:
                continue
            said = {m["content"] for m in turn["reply"] if m["role"] == "user"}
            if "higher" in said:
                lo = max(lo, guess + 1)
            elif "lower" in said:
                hi = min(hi, guess - 1)
        if lo > hi:
            return {"message": str(min(lo, self.n))}
        rng = random.Random(seed)
        if rng.random() < 0.5:
            return {"message": str((lo + hi) // 2)}
        quarter = (hi - lo) // 4
        return {"message": str(rng.randint(lo + quarter, hi - quarter))}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--difficulty", type=int, default=1, choices=[1, 2, 3])
    parser.add_argument("--crash-every", type=int, default=0, metavar="K")
    parser.add_argument("--hang-every", type=int, default=0, metavar="K")
    parser.add_argument("--answer-twice-every", type=int, default=0, metavar="K")
    parser.add_argument("--fault-worker", type=int, default=None, metavar="I")
    parser.add_argument("--slow-ms", type=int, default=0, metavar="MS")
    parser.add_argument("--error-every", type=int, default=0, metavar="K")
    args = parser.parse_args()
    if args.fault_worker is not None and os.environ.get("SKEIN_WORKER") != str(args.fault_worker):
        args.crash_every = args.hang_every = args.answer_twice_every = 0
    game = Game(args.difficulty)
    steps = resets = 0
    for line in sys.stdin:
        if not line.strip():
            continue
        request = {}
        twice = False
        try:
            request = json.loads(line)
            op = request.get("op")
            if op == "close":
                game.episodes.pop(request.get("episode"), None)
                continue
            if op in ("reset", "step") and args.slow_ms:
                time.sleep(args.slow_ms / 1000)
            if op == "info":
                answer = game.info()
            elif op == "reset":
                resets += 1
                if args.error_every and resets % args.error_every == 0:
                    answer = {"error": f"no game at reset {resets}"}
                else:
                    answer = game.reset(request["episode"], request["task"])
            elif op == "step":
                steps += 1
                if args.crash_every and steps % args.crash_every == 0:
                    print(f"env_worker_example: crashing at step {steps}", file=sys.stderr)
                    os._exit(3)
                if args.hang_every and steps % args.hang_every == 0:
                    print(f"env_worker_example: hanging at step {steps}", file=sys.stderr)
                    time.sleep(3600)
                answer = game.step(request["episode"], request["message"])
                twice = args.answer_twice_every and steps % args.answer_twice_every == 0
            elif op == "demonstrate":
                answer = game.demonstrate(request["transcript"], request["seed"])
            else:
                answer = {"error": f"unknown op {op!r}"}
        except Exception as e:  # one bad request must not take the worker down
            answer = {"error": f"{type(e).__name__}: {e}"}
        answer["id"] = request.get("id") if isinstance(request, dict) else None
        sys.stdout.write((json.dumps(answer) + "\n") * (2 if twice else 1))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
