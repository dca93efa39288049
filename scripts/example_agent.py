#!/usr/bin/env python3
"""An example agent for `skein serve`, written against the official `openai` client.

It takes tasks from the server, solves each with a short multi-turn exchange, and reports a
reward. Every model call goes through the rollout's own base URL, so the server records it
token-exactly for training; the agent never handles token ids itself (it may read them: each
choice carries a `skein` field with the prompt and completion ids, which `--log` writes out).

    loop:
        GET  {server}/tasks/next              -> {"rollout_id", "base_url", "task"} (204: none)
        chat.completions on {server}{base_url} -> ask the task's prompt
        run the local `calc` tool, send its result back as a `tool` message, ask again
        POST {server}/rollouts/{id}/reward    -> {"reward": 1.0 if the answer is right}

A task looks like {"prompt": "What is 2+3?", "expression": "2+3", "ground_truth": "5"}.

What the model gets wrong (a tool call whose arguments are not a JSON object, a conversation
that outgrows the context) is scored 0 like a wrong answer, so training learns from it;
`POST {server}/rollouts/{id}/fail`, which leaves the rollout out of training, is kept for the
agent's own faults (the server unreachable, a bug here).

Started by the trainer (`[agent] command`), the agent reads the server and key from
SKEIN_SERVER / SKEIN_API_KEY when not given them, and waits for tasks as long as the trainer
runs. On its own it exits after --idle-exit seconds without a task:

    python3 scripts/example_agent.py --server http://127.0.0.1:8000 --idle-exit 5
"""

import argparse
import ast
import json
import operator
import os
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import openai
from openai import OpenAI

CALC_TOOL = {
    "type": "function",
    "function": {
        "name": "calc",
        "description": "Evaluate integer arithmetic with + - * and parentheses.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}

# Without --idle-exit, how long an agent started by hand waits for a task before it exits.
IDLE_EXIT_S = 10.0


class ModelError(Exception):
    """A rollout the model itself spoiled: scored 0, not reported as the agent's failure."""


def calc(expression):
    """The local tool: integer arithmetic only, never `eval`."""

    def walk(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -walk(node.operand)
        raise ValueError(f"calc cannot evaluate {expression!r}")

    return str(walk(ast.parse(expression, mode="eval").body))


def tool_arguments(call):
    """A tool call's arguments, which the model writes: a JSON object, or a ModelError."""
    try:
        arguments = json.loads(call.function.arguments or "{}")
    except ValueError as e:
        raise ModelError(f"tool call arguments are not JSON: {call.function.arguments!r}") from e
    if not isinstance(arguments, dict):
        raise ModelError(f"tool call arguments are not an object: {call.function.arguments!r}")
    return arguments


def http(method, url, api_key, body=None):
    """(status, parsed JSON or None) of one plain HTTP call to the server."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            text = resp.read()
            return resp.status, (json.loads(text) if text else None)
    except urllib.error.HTTPError as e:
        text = e.read()
        try:
            return e.code, json.loads(text)
        except ValueError:
            return e.code, {"error": {"message": text.decode(errors="replace")}}


class Agent:
    def __init__(self, args):
        self.args = args
        self.server = args.server.rstrip("/")
        self.log = open(args.log, "a") if args.log else None

    def model_name(self):
        status, body = http("GET", f"{self.server}/v1/models", self.args.api_key)
        if status != 200:
            sys.exit(f"example_agent: GET /v1/models answered {status}: {body}")
        return body["data"][0]["id"]

    def ask(self, client, rollout_id, messages):
        # Sampling settings only when asked for: left out, the server applies its own, which
        # under a trainer are rollout.sampling's (any other temperature gets a 400 there).
        sampling = {}
        if self.args.max_tokens is not None:
            sampling["max_tokens"] = self.args.max_tokens
        if self.args.temperature is not None:
            sampling["temperature"] = self.args.temperature
        try:
            response = client.chat.completions.create(
                model=self.args.model,
                messages=messages,
                tools=[CALC_TOOL],
                **sampling,
            )
        except openai.BadRequestError as e:
            # The conversation the model wrote no longer fits its context (generate.rs and
            # text.rs word both refusals so); any other 400 is this agent's request at fault.
            if "shorten the prompt" in str(e):
                raise ModelError(f"the context is full: {e}") from e
            raise
        choice = response.choices[0]
        if self.log:
            exact = (choice.model_extra or {}).get("skein", {})
            line = {"rollout_id": rollout_id, **exact}
            self.log.write(json.dumps(line) + "\n")
            self.log.flush()
        return choice.message

    def solve(self, handed):
        """One rollout: two model calls with a tool result between them, then the reward."""
        rollout_id, task = handed["rollout_id"], handed["task"]
        client = OpenAI(
            base_url=self.server + handed["base_url"],
            api_key=self.args.api_key or "unused",
            max_retries=5,
        )
        messages = [{"role": "user", "content": task["prompt"]}]
        reply = self.ask(client, rollout_id, messages)
        turn = {"role": "assistant", "content": reply.content or ""}
        if reply.tool_calls:
            turn["tool_calls"] = [c.model_dump() for c in reply.tool_calls]
            calls = [(c.id, str(tool_arguments(c).get("expression", ""))) for c in reply.tool_calls]
        else:
            # The model did not ask: the agent runs the tool on the task's expression anyway.
            calls = [("local-0", task.get("expression", ""))]
        messages.append(turn)
        for call_id, expression in calls:
            try:
                result = calc(expression)
            except (ValueError, SyntaxError) as e:
                result = f"error: {e}"
            messages.append({"role": "tool", "tool_call_id": call_id, "content": result})
        answer = self.ask(client, rollout_id, messages).content or ""
        truth = str(task.get("ground_truth", "")).strip()
        correct = bool(truth) and answer.strip() == truth
        self.reward(rollout_id, correct)
        return correct

    def reward(self, rollout_id, correct):
        status, body = http("POST", f"{self.server}/rollouts/{rollout_id}/reward",
                            self.args.api_key, {"reward": 1.0 if correct else 0.0,
                                                "correct": correct})
        if status != 200:
            raise RuntimeError(f"reward for {rollout_id} answered {status}: {body}")

    def run_one(self, handed):
        """(correct, the agent's own error or None, the model's error or None) of one rollout."""
        rollout_id = handed["rollout_id"]
        try:
            try:
                return self.solve(handed), None, None
            except ModelError as e:
                # Scored as a wrong answer: /fail would drop the sample, so the policy would
                # never learn to avoid this, and its group's mean would leave it out.
                self.reward(rollout_id, False)
                return False, None, str(e)
        except Exception as e:  # one failed rollout is reported, the agent goes on
            message = f"{type(e).__name__}: {e}"
            http("POST", f"{self.server}/rollouts/{rollout_id}/fail",
                 self.args.api_key, {"error": message})
            return False, message, None

    def run(self):
        if not self.args.model:
            self.args.model = self.model_name()
        idle_exit = self.args.idle_exit
        if idle_exit is None:
            # The trainer starts its agents before its warm-up and first evaluation, which may
            # take longer than any fixed wait, and stops them itself when it is done.
            idle_exit = float("inf") if "SKEIN_WORKER" in os.environ else IDLE_EXIT_S
        done = failed = correct = model_errors = 0
        idle_since = time.monotonic()
        with ThreadPoolExecutor(self.args.concurrency) as pool:
            while self.args.max_tasks is None or done < self.args.max_tasks:
                want = self.args.concurrency
                if self.args.max_tasks is not None:
                    want = min(want, self.args.max_tasks - done)
                batch = []
                for _ in range(want):
                    status, body = http("GET", f"{self.server}/tasks/next", self.args.api_key)
                    if status == 204:
                        break
                    if status != 200:
                        sys.exit(f"example_agent: GET /tasks/next answered {status}: {body}")
                    batch.append(body)
                if not batch:
                    if time.monotonic() - idle_since >= idle_exit:
                        break
                    time.sleep(0.1)
                    continue
                for ok, error, model_error in pool.map(self.run_one, batch):
                    done += 1
                    correct += ok
                    if error:
                        failed += 1
                        print(f"example_agent: rollout failed: {error}", file=sys.stderr)
                    if model_error:
                        model_errors += 1
                        print(f"example_agent: scored 0: {model_error}", file=sys.stderr)
                idle_since = time.monotonic()
        print(json.dumps({"tasks": done, "failed": failed, "correct": correct,
                          "model_errors": model_errors}))
        return 1 if failed else 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--server", default=None,
                   help="default: $SKEIN_SERVER, else http://127.0.0.1:8000")
    p.add_argument("--api-key", default=None, help="default: $SKEIN_API_KEY")
    p.add_argument("--model", default=None, help="default: the one the server lists")
    p.add_argument("--max-tokens", type=int, default=None,
                   help="default: the server's (a trainer's rollout.sampling.max_new_tokens)")
    p.add_argument("--temperature", type=float, default=None,
                   help="default: the server's (a trainer's rollout.sampling.temperature)")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--max-tasks", type=int, default=None)
    p.add_argument("--idle-exit", type=float, default=None,
                   help=f"exit after this many seconds without a task; default {IDLE_EXIT_S:g}, "
                        "or never when the trainer started the agent ($SKEIN_WORKER set)")
    p.add_argument("--log", default=None,
                   help="append each call's token ids (the `skein` field) as JSON lines")
    args = p.parse_args()
    args.server = args.server or os.environ.get("SKEIN_SERVER") or "http://127.0.0.1:8000"
    args.api_key = args.api_key or os.environ.get("SKEIN_API_KEY") or None
    sys.exit(Agent(args).run())


if __name__ == "__main__":
    main()
