#!/usr/bin/env bash
# A headless browser for the search-page tests (tests/test_server_browser.py): Debian's chromium,
# driven by playwright through its executable path. Playwright's own browser download is not used.
# Without root or apt (a developer's machine), it only says so: those tests then skip.
set -euo pipefail
if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
else
    echo "browser_setup: no chromium and no root apt-get; the browser tests will be skipped" >&2
fi
