#!/usr/bin/env bash
# Installs the browser the `skein view` test loads its page in: Debian's `chromium`, run
# headless. Idempotent: does nothing when `chromium` is already on the PATH.
# With --check it installs nothing and only says, by its exit status, whether it is there.
set -euo pipefail

if command -v chromium >/dev/null; then
  exit 0
fi
[ "${1:-}" = "--check" ] && exit 1
packages="chromium"
if [ "$(id -u)" -eq 0 ]; then
  sudo=""
elif command -v sudo >/dev/null; then
  sudo="sudo"
else
  echo "skein setup: the view test needs the Debian package $packages, and installing it needs root" >&2
  echo "  install it (apt-get install $packages) and run this again" >&2
  exit 1
fi
echo "skein setup: installing a headless browser ($packages)" >&2
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends $packages >/dev/null
command -v chromium >/dev/null || { echo "skein setup: chromium missing after installing $packages" >&2; exit 1; }
