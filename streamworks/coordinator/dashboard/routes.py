"""The dashboard's routes under ``/ui`` (left out of the OpenAPI document).

* ``GET /ui/`` — the page; without credentials a 401 with the login form;
* ``GET /ui/panels`` — the page's panels alone, fetched every 2 s by ``refresh.js``;
* ``POST /ui/login`` — the form's token in, a session cookie out (``auth.py``);
* ``POST /ui/logout`` — the cookie cleared;
* ``GET /ui/static/<file>`` — the stylesheet and the script, from the package;
* the admin's actions on dead letters and streams (``actions.py``).

Every page sets the browser's CSRF cookie when it has none (``auth.py``); the forms
of the actions repeat it.
"""

from __future__ import annotations

from importlib import resources
from typing import TYPE_CHECKING
from urllib.parse import parse_qs

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

from streamworks.coordinator.dashboard.actions import actions_router
from streamworks.coordinator.dashboard.auth import (
    COOKIE,
    CSRF_COOKIE,
    SESSION_SECONDS,
    DashboardAuth,
    new_csrf,
    same_origin,
)
from streamworks.coordinator.dashboard.throughput import Throughput
from streamworks.coordinator.dashboard.views import Page, build_page
from streamworks.coordinator.observation import Observer

if TYPE_CHECKING:
    from streamworks.coordinator.service import CoordinatorService

__all__ = ("dashboard_router",)

#: Refresh period of the panels (ms), handed to the script through a data attribute.
REFRESH_MS = 2000
#: A login form body is one short field; anything larger is refused unread.
MAX_LOGIN_BODY = 4096
_STATIC = {"dashboard.css": "text/css; charset=utf-8", "refresh.js": "text/javascript"}
_HEADERS = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    # Not no-referrer: with it, a browser sends the login form's Origin as "null".
    "Referrer-Policy": "same-origin",
    # No inline script or style anywhere: the only script is our own file.
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
}


def dashboard_router(service: CoordinatorService, observer: Observer) -> APIRouter:
    """The ``/ui`` routes of one replica."""
    auth = DashboardAuth(service.settings)
    throughput = Throughput(service.clock)
    templates = Environment(
        loader=PackageLoader("streamworks.coordinator.dashboard", "templates"),
        autoescape=select_autoescape(default=True),
        undefined=StrictUndefined,
    )
    router = APIRouter(include_in_schema=False)

    def html(
        name: str, status: int = 200, request: Request | None = None, **context: object
    ) -> HTMLResponse:
        csrf = request.cookies.get(CSRF_COOKIE) if request is not None else None
        # Only for someone logged in: the login form itself needs no CSRF token.
        fresh = new_csrf() if request is not None and not csrf and auth.allows(request) else None
        body = templates.get_template(name).render(
            replica=service.replica,
            refresh_ms=REFRESH_MS,
            auth=auth.required,
            admin=request is not None and auth.role(request) == "admin",
            csrf=csrf or fresh or "",
            **context,
        )
        response = HTMLResponse(body, status_code=status, headers=_HEADERS)
        if fresh is not None and request is not None:
            response.set_cookie(
                CSRF_COOKIE,
                fresh,
                path="/ui",
                httponly=True,
                samesite="strict",
                secure=request.url.scheme == "https",
            )
        return response

    def login_form(request: Request, status: int, message: str | None = None) -> HTMLResponse:
        return html("login.html", status, request, message=message)

    async def current_page() -> Page:
        observation = await observer.observe()
        rates = await throughput.rates(observation.status)
        return build_page(observation, observer.history, service.replica, rates)

    @router.get("/ui")
    async def ui_root() -> Response:
        return RedirectResponse("/ui/", status_code=307)

    @router.get("/ui/")
    async def ui(request: Request) -> Response:
        if not auth.allows(request):
            return login_form(request, 401)
        return html("dashboard.html", 200, request, page=await current_page())

    @router.get("/ui/panels")
    async def panels(request: Request) -> Response:
        if not auth.allows(request):
            return JSONResponse(
                {"error": "UNAUTHORIZED", "message": "log in again", "retryable": False},
                status_code=401,
                headers=_HEADERS,
            )
        return html("panels.html", 200, request, page=await current_page())

    @router.get("/ui/login")
    async def login_page(request: Request) -> Response:
        return login_form(request, 200)

    @router.post("/ui/login")
    async def login(request: Request) -> Response:
        if not same_origin(request):
            return login_form(request, 403, "cross-site login refused")
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_LOGIN_BODY:
                return login_form(request, 413, "login form too large")
        values = parse_qs(body.decode("utf-8", "replace"), max_num_fields=4).get("token", [""])
        if not auth.required:
            return _to_dashboard(request, None)
        session = auth.session_for(values[0].strip())
        if session is None:
            return login_form(request, 401, "wrong token")
        return _to_dashboard(request, session)

    @router.post("/ui/logout")
    async def logout() -> Response:
        response = RedirectResponse("/ui/login", status_code=303, headers=_HEADERS)
        response.delete_cookie(COOKIE, path="/ui", httponly=True, samesite="strict")
        return response

    @router.get("/ui/static/{name}")
    async def static(name: str) -> Response:
        media_type = _STATIC.get(name)
        if media_type is None:
            return JSONResponse(
                {"error": "NOT_FOUND", "message": "no such file", "retryable": False},
                status_code=404,
            )
        data = (
            resources.files("streamworks.coordinator.dashboard")
            .joinpath("static", name)
            .read_bytes()
        )
        return Response(
            data,
            media_type=media_type,
            headers={"Cache-Control": "max-age=300", "X-Content-Type-Options": "nosniff"},
        )

    router.include_router(actions_router(service, auth, html))
    return router


def _to_dashboard(request: Request, session: str | None) -> Response:
    response = RedirectResponse("/ui/", status_code=303, headers=_HEADERS)
    if session is not None:
        response.set_cookie(
            COOKIE,
            session,
            max_age=SESSION_SECONDS,
            path="/ui",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
    return response
