"""``create_app(provider, token=None)``: the FastAPI app ``rankwatch serve`` runs with uvicorn.

The app serves the page and its static files from this package only (``StaticFiles`` on a fixed
folder, never a path built from a request), the API in ``routes.py`` (``POST /api/ingest`` in
``ingest.py``) and the live stream in ``live.py``, all over one ``DataProvider``
(``aggregator/provider.py``). The aggregator is started and stopped by the caller; the app's
lifespan only owns the live stream, so shutdown ends every open EventSource instead of waiting
on it.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse
from rankwatch.aggregator.provider import DataProvider
from starlette.responses import Response
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

import rankwatch

from . import (
    hwroutes,  # noqa: F401 - registers the telemetry route on the API router
    rankroutes,  # noqa: F401 - registers the rank table and node map routes
)
from .access import Access, AccessCounts, AccessGuard
from .actions import CommandCounts, actions_api
from .auth import TokenGuard
from .bodies import Bodies, BodyBudget
from .headers import SecurityHeaders
from .ingest import IngestCounts, ingest_api
from .jsonenc import StrictJSONResponse
from .live import LiveHub
from .routes import api, ops, run_query_routes

STATIC_DIR = Path(__file__).resolve().parent / "static"

# The page loads nothing from elsewhere and runs no inline script: even if some text from the
# wire were ever parsed as HTML, the browser would refuse to run what it carried.
PAGE_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; "
    "frame-ancestors 'none'; form-action 'none'"
)
PAGE_HEADERS = {
    "Content-Security-Policy": PAGE_CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",  # frame-ancestors' twin, for browsers that predate it
    "Referrer-Policy": "no-referrer",  # the first URL may carry ?token=
    "Cache-Control": "no-cache",
}


class _StaticFiles(StaticFiles):
    """Revalidate on every load (ETag) so an upgraded aggregator never serves a stale page."""

    def file_response(
        self, full_path: Any, stat_result: Any, scope: Scope, status_code: int = 200
    ) -> Response:
        response = super().file_response(full_path, stat_result, scope, status_code)
        response.headers["Cache-Control"] = "no-cache"
        response.headers["X-Content-Type-Options"] = "nosniff"
        return response


def create_app(
    provider: DataProvider, token: str | None = None, access: Access | None = None
) -> FastAPI:
    """The dashboard app over ``provider`` (``AggregatorProvider(aggregator)`` in a server).

    ``token``: when set, every route but ``/healthz`` requires it (see ``auth.py``).
    ``access``: the Host, Origin and content-type rules (``access.py``); by default the app
    answers to IP addresses and localhost only.
    """
    live = LiveHub(provider)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        live.start()
        try:
            yield
        finally:
            live.stop()

    app = FastAPI(
        title="rankwatch",
        version=rankwatch.__version__,
        description="Every rank of a distributed training job on one live chart.",
        default_response_class=StrictJSONResponse,
        lifespan=lifespan,
        docs_url=None,  # served below from the vendored Swagger UI, not from a CDN
        redoc_url=None,
    )
    app.state.provider = provider
    app.state.live = live
    app.state.ingest_counts = IngestCounts()
    app.state.access_counts = AccessCounts()
    app.state.bodies = Bodies()
    app.state.token_set = token is not None  # commands from the page need one (actions.py)
    app.state.command_counts = CommandCounts()
    app.include_router(api)
    app.include_router(run_query_routes(api))
    app.include_router(ingest_api)
    app.include_router(actions_api)
    app.include_router(ops)
    app.mount("/static", _StaticFiles(directory=STATIC_DIR), name="static")

    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", headers=PAGE_HEADERS)

    docs_page = get_swagger_ui_html(
        openapi_url="/openapi.json",
        title="rankwatch API",
        swagger_js_url="/static/vendor/swagger-ui-bundle.js",
        swagger_css_url="/static/vendor/swagger-ui.css",
        swagger_favicon_url="/static/favicon.svg",
    )
    docs_headers = {**PAGE_HEADERS, "Content-Security-Policy": docs_csp(bytes(docs_page.body))}

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return HTMLResponse(docs_page.body, headers=docs_headers)

    # innermost: only requests that passed the checks below reserve body bytes
    app.add_middleware(BodyBudget, bodies=app.state.bodies)
    if token is not None:
        app.add_middleware(TokenGuard, token=token)
    # a foreign Host or page is refused before the token or the body budget look at it
    app.add_middleware(AccessGuard, access=access or Access(), counts=app.state.access_counts)
    app.add_middleware(SecurityHeaders, html_csp=PAGE_CSP)
    return app


def docs_csp(page: bytes) -> str:
    """The page's policy for the Swagger UI page, whose one inline script (the UI's setup,
    written by FastAPI) is allowed by its hash and nothing else inline is."""
    scripts = re.findall(rb"<script>(.*?)</script>", page, re.S)
    hashes = " ".join(
        "'sha256-" + base64.b64encode(hashlib.sha256(s).digest()).decode() + "'" for s in scripts
    )
    return PAGE_CSP.replace("script-src 'self'", f"script-src 'self' {hashes}")
