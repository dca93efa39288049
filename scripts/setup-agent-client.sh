#!/usr/bin/env bash
# Installs the official `openai` Python client into the project's .venv, for
# scripts/example_agent.py and the test that runs it against `skein serve`
# (crates/skein/tests/serve.rs). Idempotent: does nothing when the package imports.
set -euo pipefail
cd "$(dirname "$0")/.."

# setup-libtorch.sh makes the .venv, and makes it again when it has no pip.
.venv/bin/python -m pip --version >/dev/null 2>&1 || ./scripts/setup-libtorch.sh

if ! .venv/bin/python -c 'import openai' 2>/dev/null; then
  echo "skein setup: installing the openai client (PyPI openai) into .venv" >&2
  .venv/bin/python -m pip install --quiet --disable-pip-version-check "openai>=1.40,<3"
  .venv/bin/python -c 'import openai' || {
    echo "skein setup: openai installed but does not import; reinstall with: .venv/bin/pip install --force-reinstall openai" >&2
    exit 1
  }
fi
