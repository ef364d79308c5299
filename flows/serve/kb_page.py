"""``GET /kb``: the knowledge-base web page, served by the API itself.

One HTML page with a small script and a style sheet from :data:`ASSETS` (package files: no
Node build, no CDN, so it works offline). The page itself needs no key; every call it makes to
``/v1/kb/...`` carries the key the user typed (kept in the tab's ``sessionStorage``). It writes
server text into the page through ``textContent`` only, and a Content-Security-Policy that
allows scripts and styles from this server alone backs that up: a passage holding markup stays
text.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path
from string import Template

from fastapi import FastAPI
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

#: The page's files, shipped inside the package: the ``kb.html`` template and ``static/`` (script, styles).
ASSETS = Path(__file__).with_name("kb_assets")
STATIC = ASSETS / "static"
ASSETS_URL = "/kb-assets"
PAGE_URL = "/kb"

#: Scripts, styles and API calls from this server only; no inline script, no framing.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


@lru_cache(maxsize=1)
def render_page() -> str:
    """The page's HTML, its asset links versioned by their content (a new release is reloaded)."""
    digest = hashlib.sha256()
    for name in ("kb.js", "kb.css"):
        digest.update((STATIC / name).read_bytes())
    template = Template((ASSETS / "kb.html").read_text(encoding="utf-8"))
    return template.substitute(assets=ASSETS_URL, version=digest.hexdigest()[:12])


def mount_kb_page(app: FastAPI) -> None:
    """Serve the page at :data:`PAGE_URL` and its files under :data:`ASSETS_URL`."""
    app.mount(ASSETS_URL, StaticFiles(directory=STATIC), name="kb-assets")

    @app.get(PAGE_URL, include_in_schema=False)
    async def kb_page() -> HTMLResponse:
        return HTMLResponse(render_page(), headers=SECURITY_HEADERS)
