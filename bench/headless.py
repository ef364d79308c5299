"""One headless Chromium page for the bench's screenshot scripts (Debian's chromium through Playwright).

``with chromium_page(1280, 860) as page:`` opens a page of that viewport with a 60 s default
timeout and closes the browser after. No browser is ever downloaded: Playwright drives the
``chromium`` on the PATH (``apt-get install chromium``), as the /kb page's test does.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def chromium_page(width: int, height: int, *, timeout_ms: int = 60_000) -> Iterator[Any]:
    """A Playwright page in headless Debian chromium; exits with a one-line error when there is none."""
    os.environ.setdefault("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")
    from playwright.sync_api import sync_playwright

    executable = shutil.which("chromium") or shutil.which("chromium-browser")
    if executable is None:
        raise SystemExit("error: chromium is not installed (apt-get install chromium)")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            page.set_default_timeout(timeout_ms)
            yield page
        finally:
            browser.close()
