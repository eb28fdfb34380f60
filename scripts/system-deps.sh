#!/usr/bin/env bash
# System packages the test suite needs beyond pip: Debian's Chromium for the browser tests.
# Idempotent and quiet when everything is present; never downloads a browser build of its own.
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
  exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing Debian's chromium for the browser tests (once)..."
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
else
  echo "note: /usr/bin/chromium is missing and cannot be installed here; browser tests will be skipped" >&2
fi
