#!/usr/bin/env bash
# What `make test` needs beyond the venv, on a Debian host as root; idempotent (each step skipped when done).
#   1. headless Chromium for the dashboard test (Debian's package);
#   2. the container tooling and local base image for the container tests (scripts/containers_setup.sh).
# Not root, or not Debian: says what is missing and exits 0 (the tests that need it then fail or skip, saying why).
set -euo pipefail
PYTHON=${1:-python3}
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  if ! command -v chromium >/dev/null 2>&1; then
    echo "[test-deps] apt-get install chromium (the dashboard test)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  fi
else
  command -v chromium >/dev/null 2>&1 || echo "test-deps: no chromium and not root on Debian: install it for the dashboard test" >&2
fi
exec "$(dirname "$0")/containers_setup.sh" "$PYTHON"
