#!/usr/bin/env bash
# Runs every path of skein on one device once and prints a pass/fail table with its figures:
# - the default job, the same in bfloat16 with every weight trained, LoRA on a bfloat16 base
#   with activation checkpointing, two data-parallel ranks, the calculator agent and partial
#   rollout, each followed by its engine-versus-trainer log-prob gap (`scripts/logp-gap.sh`),
#   which fails above its dtype's round-off bound: an engine that computes another policy;
# - the update's memory in five setups (`skein bench memory`);
# - float32, bfloat16 (every weight trained, through float32 master weights) and bfloat16 with
#   LoRA 64: the update's layouts (`skein bench train-tokens`), the training step and decode
#   (with its kernels per step), decode in the other form of the decoding copy (`skein bench
#   --decode-form`: on CUDA the CPU's, elsewhere CUDA's) and the training step with the other
#   form of AdamW (`--optimizer-form`: on CUDA op by op, elsewhere fused) and decode through
#   CUDA graphs (`--cuda-graphs`, which fails if graphs stopped; elsewhere in their fixed
#   shapes, eagerly); for the first two,
#   which train what eager trains, the same against PyTorch eager on the same shapes (with
#   master weights in bfloat16), decode against transformers' `generate`
#   (`scripts/bench_hf_generate.py`) and the decode step's matrix products alone, the most a
#   decode of the body can reach (`scripts/bench_decode_bound.py`);
# - on CUDA, the default job decoding through CUDA graphs (`rollout.cuda_graphs`), with its
#   log-prob gap and a row that fails unless every step replayed some decode from a graph.
#
#   scripts/gpu-check.sh                      # cuda, the real shapes (docs/speed.md)
#   scripts/gpu-check.sh --device cpu --tiny  # every path in a minute or two (the tests run it)
#
# Options: --device D (cuda, cuda:N, cpu), --tiny (small shapes, few steps), --skein PATH (the
# binary; default target/release/skein), --python PATH (with torch, for the eager rows; default
# .venv/bin/python, else python3), --out DIR (logs; default a fresh temporary folder), --only
# REGEX (run only the rows whose name matches the extended regular expression; a training
# row's log-prob gap goes with it), --seconds N (a time budget for the whole check: a row not
# started within it is listed as not run, and a running row is stopped when it runs out).
# Each row is also stopped after GPU_CHECK_ROW_SECONDS (default 900), and then fails.
# The table is rewritten to DIR/table.md after every row, so a check stopped from outside
# still leaves the rows it finished. After it come the ratios skein's speed is held to, read
# from the rows' logs (`scripts/gpu_check_targets.py`, also in DIR/targets.md).
# Exit status: 0 when every row run passed and none was left out by the budget, 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."
device=cuda tiny=0 skein=target/release/skein python="" out="" only="" seconds=""
while [ $# -gt 0 ]; do
  case "$1" in
    --device) device=$2; shift 2 ;;
    --tiny) tiny=1; shift ;;
    --skein) skein=$2; shift 2 ;;
    --python) python=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    *) echo "gpu-check: unknown option $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
[ -n "$python" ] || { [ -x .venv/bin/python ] && python=.venv/bin/python || python=python3; }
[ -n "$out" ] || out=$(mktemp -d /tmp/skein-gpu-check.XXXXXX)
mkdir -p "$out"
[ -x "$skein" ] || { echo "gpu-check: no skein binary at $skein (cargo build --release)" >&2; exit 2; }

if [ "$tiny" = 1 ]; then
  # Small enough for two CPU cores: every path, few steps.
  short=(--set sft.steps=20 --set trainer.steps=2 --set eval.problems=8 --set eval.every=0
         --set rollout.prompts_per_step=4 --set rollout.samples_per_prompt=4)
  shape=(--hidden 64 --layers 2 --heads 4 --kv-heads 2 --intermediate 128)
  bench=(--batch 4 --seq 64 --iters 2)
  tokens=(--groups 2 --samples 3 --prompt 200 --median-response 8 --max-response 40 --iters 1)
  memory=(--shape tiny --sequences 1 --tokens 64 --warmup-steps 0)
else
  short=(--set trainer.steps=5 --set sft.steps=200)
  # A Qwen2.5-0.5B-sized body (character vocabulary): the shape of docs/speed.md's GPU rows.
  shape=(--hidden 896 --layers 24 --heads 14 --kv-heads 2 --intermediate 4864)
  bench=(--batch 64 --seq 160 --iters 5)
  tokens=(--groups 32 --samples 8 --prompt 32 --median-response 12 --max-response 128 --iters 3)
  # Qwen2.5-0.5B's own shape and vocabulary, four sequences of 256 tokens.
  memory=(--shape qwen2.5-0.5b)
fi
dev=(--set "run.device=$device")
# The form of the decoding copy the device does not take (DecodeForm::for_device).
case "$device" in cuda*) other_form=separate ;; *) other_form=fused ;; esac
# The form of AdamW the device does not take (AdamwForm::for_device).
case "$device" in cpu) other_adamw=fused ;; *) other_adamw=op-by-op ;; esac

title="skein gpu-check on $device$([ "$tiny" = 1 ] && echo ', tiny shapes')"
[ -z "$only" ] || title+=", rows matching /$only/"
[ -z "$seconds" ] || title+=", within $seconds s"
began=$(date +%s)
rows=()
failed=0

# table: the header and the rows so far.
table() {
  echo "$title; logs in $out"
  echo "| check | result | seconds | figure |"
  echo "| --- | --- | ---: | --- |"
  printf '%s\n' "${rows[@]}"
}

# add_row ROW: records a row and rewrites $out/table.md.
add_row() {
  rows+=("$1")
  table >"$out/table.md"
}

# row_seconds: what a row may run for: GPU_CHECK_ROW_SECONDS, and no longer than the budget
# left; 0 when the budget is spent.
row_seconds() {
  local limit=${GPU_CHECK_ROW_SECONDS:-900}
  if [ -n "$seconds" ]; then
    local left=$((began + seconds - $(date +%s)))
    [ $left -gt 0 ] || left=0
    [ $left -ge "$limit" ] || limit=$left
  fi
  echo "$limit"
}

# run NAME FIGURE_PATTERN COMMAND...: runs COMMAND with its output in $out/NAME.log; the figure
# is the last four lines matching FIGURE_PATTERN, joined.
run() {
  local name=$1 pattern=$2
  shift 2
  local start end status figure limit
  limit=$(row_seconds)
  if [ "$limit" -eq 0 ]; then
    add_row "| $name | not run (time budget spent) | 0.0 | |"
    failed=1
    echo "gpu-check: $name: not run" >&2
    return
  fi
  start=$(date +%s.%N)
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  status=$?
  end=$(date +%s.%N)
  figure=$(grep -E "$pattern" "$out/$name.log" | tail -4 | tr -s ' ' | paste -sd ';' -)
  local verdict=pass
  [ $status -eq 0 ] || { verdict="FAIL ($status)"; failed=1; figure=$(tail -1 "$out/$name.log" | cut -c1-110); }
  add_row "| $name | $verdict | $(awk "BEGIN { printf \"%.1f\", $end - $start }") | $figure |"
  echo "gpu-check: $name: $verdict" >&2
}

# selected NAME: whether --only lets row NAME run.
selected() {
  [ -z "$only" ] || [[ $1 =~ $only ]]
}

# check NAME FIGURE_PATTERN COMMAND...: `run`, for the rows --only selects.
check() {
  selected "$1" || return 0
  run "$@"
}

# train NAME ARGS...: a training row writing $out/NAME, then its log-prob gap's row.
train() {
  local name=$1
  shift
  selected "$name" || return 0
  run "$name" "eval after RL" "$skein" train --overwrite "${dev[@]}" "${short[@]}" "$@" \
    --set "run.dir=$out/$name"
  run "$name-logp-gap" "mean" scripts/logp-gap.sh "$out/$name"
}

check devices "^cuda|^cpu" "$skein" devices
train default-job
train full-bf16 --set model.dtype=bfloat16
train lora-bf16-checkpointing --set lora.rank=16 --set model.dtype=bfloat16 \
  --set trainer.activation_checkpointing=true
train dp2-threads --set trainer.dp_size=2
train calculator-agent --config configs/calculator.toml
# A budget below the response limit, so samples pause and resume.
train partial-rollout --set task.name=reverse --set model.max_positions=256 \
  --set rollout.partial.enabled=true --set rollout.sampling.max_new_tokens=32 \
  --set rollout.partial.token_budget=8
# Graphs that fail go back to ordinary decode and the run goes on: the row passes only where
# every step replayed some of its decode from a graph.
replayed='import json, sys
f = [r["rollout/graph_replayed_fraction"] for r in map(json.loads, open(sys.argv[1]))
     if "rollout/graph_replayed_fraction" in r]
print(f"graph replayed fraction: {min(f, default=0):.2f} at least, over {len(f)} steps")
sys.exit(0 if f and min(f) > 0 else 1)'
case "$device" in cuda*)
  train cuda-graphs --set rollout.cuda_graphs=true
  check cuda-graphs-replayed "replayed fraction" "$python" -c "$replayed" "$out/cuda-graphs/metrics.jsonl"
  ;;
esac
check bench-memory "peak / full float32 peak" "$skein" bench memory --device "$device" "${memory[@]}"
for config in float32 bfloat16 bfloat16-lora64; do
  dtype=${config%%-*} lora=() masters=()
  [ "$config" = "$dtype" ] || lora=(--lora-rank 64)
  [ "$dtype" = float32 ] || masters=(--master-weights)
  check "layouts-$config" "shared-prefix" "$skein" bench train-tokens --device "$device" \
    --dtype "$dtype" "${lora[@]}" "${shape[@]}" --vocab 64 "${tokens[@]}"
  check "bench-skein-$config" "train step|train ops|^decode" "$skein" bench --device "$device" \
    --dtype "$dtype" "${lora[@]}" "${shape[@]}" --vocab 64 "${bench[@]}"
  if [ ${#lora[@]} -eq 0 ]; then
    check "bench-eager-$config" "eager train step|eager decode" "$python" \
      scripts/bench_pytorch_eager.py --device "$device" --dtype "$dtype" "${masters[@]}" \
      "${shape[@]}" --vocab 64 "${bench[@]}"
    check "bench-generate-$config" "transformers generate \\(" "$python" \
      scripts/bench_hf_generate.py --device "$device" --dtype "$dtype" "${shape[@]}" --vocab 64 \
      "${bench[@]}"
    check "decode-bound-$config" "products alone" "$python" scripts/bench_decode_bound.py \
      --device "$device" --dtype "$dtype" "${shape[@]}" --vocab 64 "${bench[@]}"
  fi
  check "decode-$other_form-$config" "^decode" "$skein" bench --device "$device" --dtype "$dtype" \
    "${lora[@]}" "${shape[@]}" --vocab 64 "${bench[@]}" --decode-form "$other_form" --decode-only
  check "adamw-$other_adamw-$config" "train step|train ops" "$skein" bench --device "$device" \
    --dtype "$dtype" "${lora[@]}" "${shape[@]}" --vocab 64 "${bench[@]}" \
    --optimizer-form "$other_adamw"
  check "decode-graphs-$config" "^decode" "$skein" bench --device "$device" --dtype "$dtype" \
    "${lora[@]}" "${shape[@]}" --vocab 64 "${bench[@]}" --cuda-graphs --decode-only
done

[ ${#rows[@]} -gt 0 ] || { echo "gpu-check: no row's name matches /$only/" >&2; exit 2; }
table
echo
echo "Targets, from the rows above (also in $out/targets.md):"
"$python" scripts/gpu_check_targets.py "$out" >"$out/targets.md" || failed=1
cat "$out/targets.md"
exit $failed
