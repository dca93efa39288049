"""Reads a finished `scripts/gpu-check.sh` folder and prints, as a markdown table, the ratios
that skein's GPU speed is held to (docs/speed.md, "On a GPU"), each from the rows that
measured it and against its goal:

- the update against PyTorch eager, tokens per second, in each dtype: the training step
  (`bench-skein-*` over `bench-eager-*`, the same batch) and each layout of `layouts-*`
  (computed tokens per second over eager's); goal at least 0.9x. bfloat16 with LoRA is read
  against eager's bfloat16 step with every weight trained, the work LoRA saves included;
- shared prefixes against packing alone, in wall time (`layouts-*`: packed's update seconds
  over the shared prefix's); goal above 1x;
- decode against transformers' `generate` on the same body, batch and dtype, with skein's
  default decode and through CUDA graphs; goal at least 1x, then 2x. Beside them, the decode
  step's matrix products alone against `generate`: where that is below 2x, so is any decode
  that launches them one by one;
- bfloat16 against float32, every weight trained, in the training step and in decode; goal at
  least 2x.

A ratio whose rows did not both pass reads "not measured" and names them; one whose rows the
check left out (`--only`) is not listed. The ratios say nothing about whether the paths work
(the check's own table does), so this script fails only on a folder it cannot read.

    python3 scripts/gpu_check_targets.py LOGS_DIR
"""
import re
import sys
from pathlib import Path

RATE = r"([0-9.]+) tokens/s"
TRAIN = re.compile(r"^(?:pytorch eager )?train step \(.*\): [0-9.]+ ms, " + RATE, re.M)
DECODE = re.compile(r"^(?:pytorch eager |transformers generate |decode bound, products alone )?"
                    r"(?:decode )?\(batch [^)]*\): " + RATE, re.M)
LAYOUTS = ("padded", "packed", "shared-prefix")


class Logs:
    """The rows of one check: which passed, and their logs."""

    def __init__(self, folder):
        self.folder = Path(folder)
        table = (self.folder / "table.md").read_text()
        # The rows alone: the title may hold `|` too (an --only pattern).
        verdicts = {
            cells[1].strip(): cells[2].strip()
            for cells in (line.split("|") for line in table.splitlines() if line.startswith("| "))
            if len(cells) > 2
        }
        self.listed = set(verdicts)
        self.passed = {row for row, verdict in verdicts.items() if verdict == "pass"}

    def figure(self, row, pattern):
        """The first number `pattern` captures in `row`'s log, or None where the row did not
        pass or printed no such line."""
        if row not in self.passed:
            return None
        found = pattern.search((self.folder / f"{row}.log").read_text())
        return float(found.group(1)) if found else None

    def layout(self, row, name):
        """A layout's (update seconds, computed tokens per second) from `skein bench
        train-tokens`'s table, or None."""
        if row not in self.passed:
            return None
        for line in (self.folder / f"{row}.log").read_text().splitlines():
            cells = line.split()
            if cells and cells[0] == name and len(cells) >= 8:
                return float(cells[3]), float(cells[-1])
        return None


def ratio_row(logs, what, rows, top, bottom, goals, strictly=False):
    """A table row: `what`, top / bottom, and which of `goals` (the first the target, the
    others further goals) it meets; `strictly` where the ratio must pass the goal, not reach it.
    None where one of `rows` is not in the check (`--only` left it out)."""
    if not all(row in logs.listed for row in rows):
        return None
    wanted = ", then ".join(f"{'>' if strictly else '≥'} {goal:g}x" for goal in goals)
    if top is None or bottom is None or bottom <= 0:
        needed = " and ".join(rows)
        return f"| {what} | not measured ({needed} must pass) | {wanted} | |"
    value = top / bottom
    met = [goal for goal in goals if (value > goal if strictly else value >= goal)]
    verdict = f"{met[-1]:g}x met" if len(goals) > 1 and met else ("met" if met else "not met")
    return f"| {what} | {value:.2f}x | {wanted} | {verdict} |"


def update_rows(logs):
    """The update against eager, and shared prefixes against packing alone."""
    out = []
    for config, eager in (("float32", "float32"), ("bfloat16", "bfloat16"),
                          ("bfloat16-lora64", "bfloat16")):
        skein_row, eager_row = f"bench-skein-{config}", f"bench-eager-{eager}"
        layouts_row = f"layouts-{config}"
        eager_rate = logs.figure(eager_row, TRAIN)
        against = "eager" if config == eager else "eager's full bfloat16"
        out.append(ratio_row(logs, f"training step, {config}, against {against}",
                             [skein_row, eager_row], logs.figure(skein_row, TRAIN), eager_rate,
                             [0.9]))
        measured = {name: logs.layout(layouts_row, name) for name in LAYOUTS}
        for name in LAYOUTS:
            rate = measured[name] and measured[name][1]
            out.append(ratio_row(logs, f"update, {config}, {name}, computed tokens/s against "
                                 f"{against}", [layouts_row, eager_row], rate, eager_rate, [0.9]))
        packed, shared = measured["packed"], measured["shared-prefix"]
        out.append(ratio_row(logs, f"update, {config}, shared prefix against packing, in wall "
                             "time", [layouts_row], packed and packed[0], shared and shared[0],
                             [1.0], strictly=True))
    return out


def decode_rows(logs):
    """Decode against `generate`, and the products alone beside it."""
    out = []
    for dtype in ("float32", "bfloat16"):
        generate_row = f"bench-generate-{dtype}"
        generate = logs.figure(generate_row, DECODE)
        for what, row, goals in (
            ("skein's decode", f"bench-skein-{dtype}", [1.0, 2.0]),
            ("skein's decode through CUDA graphs", f"decode-graphs-{dtype}", [1.0, 2.0]),
            ("decode's matrix products alone, its ceiling", f"decode-bound-{dtype}", [2.0]),
        ):
            out.append(ratio_row(logs, f"{what}, {dtype}, against `generate`",
                                 [row, generate_row], logs.figure(row, DECODE), generate, goals))
    return out


def precision_rows(logs):
    """bfloat16 against float32, every weight trained."""
    rows = ["bench-skein-bfloat16", "bench-skein-float32"]
    return [
        ratio_row(logs, f"{what}, bfloat16 against float32", rows,
                  logs.figure(rows[0], pattern), logs.figure(rows[1], pattern), [2.0])
        for what, pattern in (("training step", TRAIN), ("decode", DECODE))
    ]


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: gpu_check_targets.py LOGS_DIR (scripts/gpu-check.sh's --out folder)")
    try:
        logs = Logs(sys.argv[1])
    except OSError as e:
        sys.exit(f"gpu_check_targets: cannot read the check's table: {e}")
    rows = [row for row in update_rows(logs) + decode_rows(logs) + precision_rows(logs) if row]
    if not rows:
        print("(no target's rows were in the check)")
        return
    print("| target | measured | goal | |")
    print("| --- | ---: | --- | --- |")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
