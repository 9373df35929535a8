"""``GET /approvals``: the approval inbox as one static web page.

The page (``static/approvals.html``: plain JavaScript, no build step, nothing
from a CDN) asks its user for a token and calls the JSON routes with it, so it
carries no credentials and no tenant of its own. It is served with a strict
Content-Security-Policy: only its own inline script and style (by hash), calls
to this origin only, no frames, no plugins, no base or form targets elsewhere;
and with HSTS (:data:`HSTS`): a browser that saw it once never asks for the page
(where its user pastes a token) over plain HTTP again. Everything it renders is
set as text, never parsed as HTML.
"""

from __future__ import annotations

import base64
import hashlib
import re
from functools import cache
from pathlib import Path

PAGE_FILE = Path(__file__).resolve().parent / "static" / "approvals.html"

#: ``Strict-Transport-Security``: two years, this host only (the deployment's other
#: hosts are not this page's to decide). Browsers ignore it over plain HTTP (locally).
HSTS = "max-age=63072000"

_BLOCK = re.compile(r"<(script|style)>(.*?)</\1>", re.DOTALL)


def _digest(source: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(source.encode()).digest()).decode() + "'"


@cache
def page() -> tuple[str, dict[str, str]]:
    """The page's HTML and the headers it is served with (read once per process)."""
    html = PAGE_FILE.read_text(encoding="utf-8")
    scripts = [_digest(body) for tag, body in _BLOCK.findall(html) if tag == "script"]
    styles = [_digest(body) for tag, body in _BLOCK.findall(html) if tag == "style"]
    policy = "; ".join(
        [
            "default-src 'none'",
            f"script-src {' '.join(scripts)}",
            f"style-src {' '.join(styles)}",
            "connect-src 'self'",
            "img-src 'self' data:",
            "base-uri 'none'",
            "form-action 'none'",
            "frame-ancestors 'none'",
        ]
    )
    headers = {
        "Content-Security-Policy": policy,
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "Cache-Control": "no-cache",
        "Strict-Transport-Security": HSTS,
    }
    return html, headers
