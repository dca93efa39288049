#!/usr/bin/env bash
# Installs the `peft` Python package into the project's .venv, for the test that loads a
# LoRA adapter skein saved with PEFT and compares logits (crates/skein/tests/hf_export.rs).
# Idempotent: does nothing when the package imports.
set -euo pipefail
cd "$(dirname "$0")/.."

# setup-libtorch.sh makes the .venv, and makes it again when it has no pip.
.venv/bin/python -m pip --version >/dev/null 2>&1 || ./scripts/setup-libtorch.sh

if ! .venv/bin/python -c "import peft" 2>/dev/null; then
  echo "skein setup: installing peft (PyPI peft) into .venv" >&2
  .venv/bin/python -m pip install --quiet --disable-pip-version-check "peft>=0.13,<1"
  .venv/bin/python -c "import peft" || {
    echo "skein setup: peft installed but does not import; reinstall with: .venv/bin/pip install --force-reinstall peft" >&2
    exit 1
  }
fi
