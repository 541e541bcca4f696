"""Self-hosted ``/docs`` (Swagger UI) and ``/redoc``: no CDN, so they work air-gapped.

The JavaScript and CSS come from the ``fastapi-offline`` wheel (Swagger UI and ReDoc
bundles, MIT-licensed); only its ``static/`` directory is used, served under
``/docs-static``. FastAPI's own pages load them from a CDN, so ``create_app`` turns those off
(``docs_url=None, redoc_url=None``) and calls :func:`install_docs` instead.
"""

from __future__ import annotations

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

ASSETS_URL = "/docs-static"
OAUTH2_REDIRECT_URL = "/docs/oauth2-redirect"

#: ReDoc's bundle hard-codes its footer logo on Redocly's CDN; offline, that is a failed
#: request to a foreign origin on every page view. It is served with an inline empty image.
REDOC_CDN_LOGO = b"https://cdn.redoc.ly/redoc/logo-mini.svg"
EMPTY_IMAGE = b"data:image/svg+xml,%3Csvg xmlns='http://www.w3.org/2000/svg'/%3E"


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
        return Response(redoc_bundle(), media_type="text/javascript")

    app.mount(ASSETS_URL, StaticFiles(directory=assets_dir()), name="docs-static")

    def _root(request: Request) -> str:
        return str(request.scope.get("root_path", ""))

    @app.get(docs_url, include_in_schema=False)
    def swagger_ui(request: Request) -> HTMLResponse:
        root = _root(request)
        return get_swagger_ui_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{app.title} - API docs",
            oauth2_redirect_url=f"{root}{OAUTH2_REDIRECT_URL}",
            swagger_js_url=f"{root}{ASSETS_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{ASSETS_URL}/swagger-ui.css",
            swagger_favicon_url=f"{root}{ASSETS_URL}/favicon.png",
            # no validator badge: it would call an external validation service
            swagger_ui_parameters={"validatorUrl": None},
        )

    @app.get(OAUTH2_REDIRECT_URL, include_in_schema=False)
    def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get(redoc_url, include_in_schema=False)
    def redoc(request: Request) -> HTMLResponse:
        root = _root(request)
        return get_redoc_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{root}{ASSETS_URL}/redoc.standalone.js",
            redoc_favicon_url=f"{root}{ASSETS_URL}/favicon.png",
            with_google_fonts=False,
        )
