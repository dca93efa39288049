#!/usr/bin/env bash
# The engine-versus-trainer log-prob gap of a finished run: the largest per-step mean and max
# of `logp_mismatch/*` in RUN_DIR/metrics.jsonl, beside the dtype's round-off bound
# (`logp_mismatch/tolerance`, docs/diagnoses.md). Exits 1 when a step's mean passed the bound,
# a step's gap was not finite, or the run logged no gap at all.
#
#   scripts/logp-gap.sh runs/default
set -uo pipefail
[ $# -eq 1 ] || { echo "usage: $0 RUN_DIR" >&2; exit 2; }
metrics=$1/metrics.jsonl
[ -r "$metrics" ] || { echo "logp-gap: no $metrics" >&2; exit 2; }
# Each figure with its line's number (one step a line), so a step with both its mean and its max
# non-finite counts once. metrics.jsonl writes a non-finite value as null: compared as a string
# it would pass for the largest gap and print as 0, so such values are counted apart.
grep -no '"logp_mismatch/[a-z]*":[^,}]*' "$metrics" | tr -d '"' | tr ':' ' ' | awk '
  function finite(v) { return v ~ /^-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$/ }
  $2 ~ /^logp_mismatch\/(mean|max)$/ && !finite($3) { if (!($1 in bad)) nbad++; bad[$1] = 1 }
  $2 == "logp_mismatch/mean" { n++ }
  !finite($3) { next }
  $2 == "logp_mismatch/mean" { seen = 1; if ($3 + 0 > mean) mean = $3 + 0 }
  $2 == "logp_mismatch/max" { if ($3 + 0 > max) max = $3 + 0 }
  $2 == "logp_mismatch/tolerance" { if ($3 + 0 > bound) bound = $3 + 0 }
  END {
    if (n == 0) { print "logp-gap: the run logged no engine-versus-trainer gap"; exit 1 }
    if (seen) printf "steps %d, largest mean %.2g, largest max %.2g nats, bound on the mean %.2g\n", n, mean, max, bound
    if (nbad) { printf "logp-gap: %d step%s with a non-finite gap\n", nbad, nbad == 1 ? "" : "s"; exit 1 }
    exit mean > bound
  }'
