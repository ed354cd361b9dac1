"""The browser the Playwright tests launch: Debian's Chromium, with flags for a headless box."""

from __future__ import annotations

CHROMIUM = "/usr/bin/chromium"  # Debian's package; `make test` installs it when missing
ARGS = [
    "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync",
]
