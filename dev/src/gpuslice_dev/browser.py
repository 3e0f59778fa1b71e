"""The headless browser that looks at the cluster view (``/ui``): Debian's ``chromium`` via Playwright.

Used by the browser tier (``tests/e2e/test_ui_browser.py``) and by ``hack/screenshot_ui.py``.
Playwright drives the system browser (``apt-get install chromium``, ``executable_path``), so no
browser is downloaded; the flags keep it headless, sandbox-free (it runs as root in containers)
and off the network except for the pages it is sent to (no QUIC, no background, component or
sync traffic; Chromium's command-line switches are listed at
https://peter.sh/experiments/chromium-command-line-switches/).

Playwright is a development dependency only: it is imported when a browser is started, never
when this module is, so the package installs and imports without it.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from playwright.sync_api import BrowserContext

CHROMIUM = Path("/usr/bin/chromium")
"""Debian's ``chromium`` package."""
ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


def launch_options(**extra: Any) -> dict[str, Any]:
    """Keyword arguments for Playwright's ``chromium.launch_persistent_context`` (``extra`` added)."""
    return {"executable_path": str(CHROMIUM), "args": list(ARGS), "headless": True, **extra}


@contextlib.contextmanager
def persistent_context(**extra: Any) -> Iterator[BrowserContext]:
    """A headless system Chromium with a throw-away profile; closed on leaving.

    Args:
        extra: further ``launch_persistent_context`` arguments (e.g. ``viewport``).
    """
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="gpuslice-ui-") as profile, sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(profile, **launch_options(**extra))
        try:
            yield context
        finally:
            context.close()
