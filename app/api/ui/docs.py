"""Self-hosted ``/docs`` (Swagger UI) and ``/redoc``: no CDN, so they work air-gapped.

The JavaScript and CSS come from the ``fastapi-offline`` wheel (Swagger UI and ReDoc
bundles, MIT-licensed); only its ``static/`` directory is used, served under
``/docs-static``. FastAPI's own pages load them from a CDN, so ``create_app`` turns those off
(``docs_url=None, redoc_url=None``) and calls :func:`install_docs` instead.
"""

from __future__ import annotations

import base64
import hashlib
import re
from functools import cache
from importlib.resources import files
from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.staticfiles import StaticFiles
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.types import Scope

from app.api.ui.router import SECURITY_HEADERS

ASSETS_URL = "/docs-static"
OAUTH2_REDIRECT_URL = "/docs/oauth2-redirect"

#: ReDoc's bundle hard-codes its footer logo on Redocly's CDN; offline, that is a failed
#: request to a foreign origin on every page view. It is served with an inline empty image.
REDOC_CDN_LOGO = b"https://cdn.redoc.ly/redoc/logo-mini.svg"
EMPTY_IMAGE = b"data:image/svg+xml,%3Csvg xmlns='http://www.w3.org/2000/svg'/%3E"


_INLINE_SCRIPT = re.compile(rb"<script>(.*?)</script>", re.DOTALL)


def docs_policy(html: bytes) -> str:
    """The pages' Content-Security-Policy: same origin only, as the dashboard's, plus the
    hashes of the page's own inline scripts (the bundles' start-up calls), inline styles
    (both bundles set style attributes and ReDoc injects style elements), ``data:`` images
    (ReDoc's logo above) and ``blob:`` workers (ReDoc's search)."""
    hashes = " ".join(
        "'sha256-" + base64.b64encode(hashlib.sha256(body).digest()).decode() + "'"
        for body in _INLINE_SCRIPT.findall(html)
    )
    return "; ".join(
        [
            "default-src 'none'",
            f"script-src 'self' {hashes}".rstrip(),
            "style-src 'self' 'unsafe-inline'",
            "img-src 'self' data:",
            "font-src 'self'",
            "connect-src 'self'",
            "worker-src 'self' blob:",
            "base-uri 'none'",
            "form-action 'none'",
            "frame-ancestors 'none'",
        ]
    )


def _secured(page: HTMLResponse) -> HTMLResponse:
    """``page`` with the dashboard's security headers and :func:`docs_policy`, on
    /docs and /redoc as on the dashboard."""
    page.headers.update(SECURITY_HEADERS)
    page.headers["Content-Security-Policy"] = docs_policy(bytes(page.body))
    return page


class DocsAssets(StaticFiles):
    """The bundles, with the same headers as the dashboard's files."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        response.headers.update(SECURITY_HEADERS)
        return response


def assets_dir() -> Path:
    """The directory holding ``swagger-ui-bundle.js``, ``swagger-ui.css`` and ReDoc."""
    return Path(str(files("fastapi_offline") / "static"))


@cache
def redoc_bundle() -> bytes:
    """The ReDoc bundle without its one reference to another origin."""
    return (assets_dir() / "redoc.standalone.js").read_bytes().replace(REDOC_CDN_LOGO, EMPTY_IMAGE)


def install_docs(app: FastAPI, *, docs_url: str = "/docs", redoc_url: str = "/redoc") -> None:
    """Serve Swagger UI at ``docs_url`` and ReDoc at ``redoc_url`` from packaged assets."""

    @app.get(f"{ASSETS_URL}/redoc.standalone.js", include_in_schema=False)
    def redoc_js() -> Response:
        return Response(redoc_bundle(), media_type="text/javascript", headers=SECURITY_HEADERS)

    app.mount(ASSETS_URL, DocsAssets(directory=assets_dir()), name="docs-static")

    def _root(request: Request) -> str:
        return str(request.scope.get("root_path", ""))

    @app.get(docs_url, include_in_schema=False)
    def swagger_ui(request: Request) -> HTMLResponse:
        root = _root(request)
        return _secured(
            get_swagger_ui_html(
                openapi_url=f"{root}{app.openapi_url}",
                title=f"{app.title} - API docs",
                oauth2_redirect_url=f"{root}{OAUTH2_REDIRECT_URL}",
                swagger_js_url=f"{root}{ASSETS_URL}/swagger-ui-bundle.js",
                swagger_css_url=f"{root}{ASSETS_URL}/swagger-ui.css",
                swagger_favicon_url=f"{root}{ASSETS_URL}/favicon.png",
                # no validator badge: it would call an external validation service
                swagger_ui_parameters={"validatorUrl": None},
            )
        )

    @app.get(OAUTH2_REDIRECT_URL, include_in_schema=False)
    def swagger_ui_redirect() -> HTMLResponse:
        return _secured(get_swagger_ui_oauth2_redirect_html())

    @app.get(redoc_url, include_in_schema=False)
    def redoc(request: Request) -> HTMLResponse:
        root = _root(request)
        return _secured(
            get_redoc_html(
                openapi_url=f"{root}{app.openapi_url}",
                title=f"{app.title} - ReDoc",
                redoc_js_url=f"{root}{ASSETS_URL}/redoc.standalone.js",
                redoc_favicon_url=f"{root}{ASSETS_URL}/favicon.png",
                with_google_fonts=False,
            )
        )
