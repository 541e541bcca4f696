"""The dashboard: static HTML, CSS and ES modules under ``/ui/``, with a strict CSP.

No build step and no CDN: the files in ``app/api/ui/static`` are what the browser runs. The
dashboard talks to the same ``/v1`` API as every client, with the key the user pastes
(kept in ``sessionStorage``; never in a URL).
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles
from starlette.responses import RedirectResponse, Response
from starlette.types import Scope

STATIC_DIR = Path(__file__).parent / "static"

#: Same-origin only: no external script, style, image, font or connection, no framing.
CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self'",
        "font-src 'self'",
        "connect-src 'self'",
        "manifest-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    ]
)

SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-cache",
}


class DashboardFiles(StaticFiles):
    """Static files with the dashboard's security headers on every answer."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        response.headers.update(SECURITY_HEADERS)
        return response


def install_dashboard(app: FastAPI, *, url: str = "/ui") -> None:
    """Mount the dashboard at ``url + "/"`` (``url`` itself redirects there)."""

    @app.get(url, include_in_schema=False)
    def dashboard_redirect() -> RedirectResponse:
        return RedirectResponse(url + "/", status_code=308)

    app.mount(url, DashboardFiles(directory=STATIC_DIR, html=True), name="ui")
