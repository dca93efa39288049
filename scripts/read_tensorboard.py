"""Reads a directory of TensorBoard event files with the `tensorboard` package and prints,
as JSON, the event files it found and every scalar: {"files": [...], "scalars": {tag:
[[step, value], ...]}}, each tag's points in the order written.

Usage: .venv/bin/python scripts/read_tensorboard.py RUN_DIR/tensorboard
(crates/skein/tests/tracking.rs compares the output with the run's metrics.jsonl).
"""

import json
import os
import sys

from tensorboard.backend.event_processing import event_accumulator, io_wrapper


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: read_tensorboard.py DIR")
    logdir = sys.argv[1]
    files = sorted(
        os.path.basename(p)
        for p in os.listdir(logdir)
        if io_wrapper.IsTensorFlowEventsFile(os.path.join(logdir, p))
    )
    # size_guidance 0 keeps every point (the default samples down to 10,000 per tag).
    acc = event_accumulator.EventAccumulator(
        logdir, size_guidance={event_accumulator.SCALARS: 0}
    )
    acc.Reload()
    scalars = {
        tag: [[e.step, e.value] for e in acc.Scalars(tag)]
        for tag in acc.Tags()[event_accumulator.SCALARS]
    }
    json.dump({"files": files, "scalars": scalars}, sys.stdout)


if __name__ == "__main__":
    main()
