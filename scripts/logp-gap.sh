#!/usr/bin/env bash
# The engine-versus-trainer log-prob gap of a finished run: the largest per-step mean and max
# of `logp_mismatch/*` in RUN_DIR/metrics.jsonl, beside the dtype's round-off bound
# (`logp_mismatch/tolerance`, docs/diagnoses.md). Exits 1 when a step's mean passed the bound,
# or the run logged no gap at all.
#
#   scripts/logp-gap.sh runs/default
set -uo pipefail
[ $# -eq 1 ] || { echo "usage: $0 RUN_DIR" >&2; exit 2; }
metrics=$1/metrics.jsonl
[ -r "$metrics" ] || { echo "logp-gap: no $metrics" >&2; exit 2; }
grep -o '"logp_mismatch/[a-z]*":[^,}]*' "$metrics" | tr -d '"' | tr ':' ' ' | awk '
  $1 == "logp_mismatch/mean" { n++; if ($2 > mean) mean = $2 }
  $1 == "logp_mismatch/max" { if ($2 > max) max = $2 }
  $1 == "logp_mismatch/tolerance" { if ($2 > bound) bound = $2 }
  END {
    if (n == 0) { print "logp-gap: the run logged no engine-versus-trainer gap"; exit 1 }
    printf "steps %d, largest mean %.2g, largest max %.2g nats, bound on the mean %.2g\n", n, mean, max, bound
    exit mean > bound
  }'
