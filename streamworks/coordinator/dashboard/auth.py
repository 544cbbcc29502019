"""Who may see the dashboard, and how a browser proves it without holding a token.

Accepted credentials: the viewer token (``viewer_token``), the member token
(``token``) or the admin token, either as ``Authorization: Bearer <token>`` (curl,
scripts) or as a session cookie. A browser gets the cookie from the login form: it
POSTs the token once, and the answer sets ``sw_ui_session`` (HttpOnly, SameSite=Strict,
Path=/ui, Secure over https) to ``v1.<expiry>.<HMAC-SHA256(token, expiry)>`` — derived
from the token, never the token itself, so the page, the browser's storage and its
script never see a token. Any replica holding the same token verifies the cookie (no
server-side session store); changing the token ends every session; a session lasts
``SESSION_SECONDS``. With no token configured at all, the dashboard is open, like the
API.

Acting (replaying or deleting dead letters, scaling a stream) takes the **admin**
credential — the admin token, or the member token when no admin token is set, as for
the API's topology changes — never the viewer token: :meth:`DashboardAuth.role`
tells which one a request carries. Every action is a form POST that must also carry
the CSRF token of the browser: a random value set once in the cookie ``sw_ui_csrf``
(HttpOnly, SameSite=Strict) and repeated in each form (double submit). Another site
can neither read that cookie nor have the browser send it, so it cannot forge an
action, with or without tokens configured.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Callable
from typing import Literal
from urllib.parse import urlsplit

from starlette.requests import Request

from streamworks.settings import Settings

__all__ = (
    "COOKIE",
    "CSRF_COOKIE",
    "SESSION_SECONDS",
    "DashboardAuth",
    "Role",
    "new_csrf",
    "same_origin",
)

COOKIE = "sw_ui_session"
CSRF_COOKIE = "sw_ui_csrf"
#: Who a request is: may it act (admin) or only look (viewer)?
Role = Literal["admin", "viewer"]
SESSION_SECONDS = 12 * 3600
_CONTEXT = b"streamworks/ui-session/v1/"


class DashboardAuth:
    """Checks tokens and session cookies for one replica's settings.

    Args:
        settings: the replica's settings (its viewer, member and admin tokens).
        now: wall-clock time in seconds (sessions are checked by every replica, so
            they expire on the wall clock, not a replica's monotonic one).
    """

    def __init__(
        self,
        settings: Settings,
        # Real wall time on purpose: every replica checks the session cookies it signed.
        now: Callable[[], float] = time.time,  # noqa: TID251
    ) -> None:
        secrets_ = (settings.viewer_token, settings.token, settings.admin_token)
        self._tokens = [s.get_secret_value().encode() for s in secrets_ if s is not None]
        # The credential of topology changes, as the API has it (http.py).
        admin = settings.admin_token or settings.token
        self._admin = admin.get_secret_value().encode() if admin is not None else None
        self._now = now

    @property
    def required(self) -> bool:
        """Whether any token is configured (else the dashboard is open)."""
        return bool(self._tokens)

    def _matching(self, presented: str) -> bytes | None:
        """The configured token equal to ``presented`` (every one compared in
        constant time, so timing does not tell which one matched, or how closely)."""
        found = None
        for token in self._tokens:
            if secrets.compare_digest(presented.encode(), token):
                found = token
        return found

    def session_for(self, presented: str) -> str | None:
        """A session cookie value for a correct token; None for a wrong one."""
        token = self._matching(presented)
        if token is None:
            return None
        expiry = str(int(self._now()) + SESSION_SECONDS)
        return f"v1.{expiry}.{_sign(token, expiry)}"

    def valid_session(self, value: str) -> bool:
        return self._session_token(value) is not None

    def _session_token(self, value: str) -> bytes | None:
        """The token a valid, unexpired session cookie was signed with."""
        version, _, rest = value.partition(".")
        expiry, _, signature = rest.partition(".")
        if version != "v1" or not expiry.isdigit() or int(expiry) <= self._now():
            return None
        found = None
        for token in self._tokens:
            if secrets.compare_digest(_sign(token, expiry).encode(), signature.encode()):
                found = token
        return found

    def allows(self, request: Request) -> bool:
        """Whether the request carries a valid bearer token or session cookie."""
        return self.role(request) is not None

    def role(self, request: Request) -> Role | None:
        """``admin`` for the admin credential (or an open dashboard), ``viewer`` for
        any other valid token or session, None without one."""
        if not self._tokens:
            return "admin"  # no token at all: open, like the API
        scheme, _, presented = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and presented:
            token = self._matching(presented)
        else:
            cookie = request.cookies.get(COOKIE)
            token = self._session_token(cookie) if cookie is not None else None
        if token is None:
            return None
        admin = self._admin is not None and secrets.compare_digest(token, self._admin)
        return "admin" if admin else "viewer"

    @staticmethod
    def csrf_ok(request: Request, presented: str) -> bool:
        """Whether a form's CSRF field repeats the browser's CSRF cookie."""
        cookie = request.cookies.get(CSRF_COOKIE, "")
        return bool(cookie) and secrets.compare_digest(cookie.encode(), presented.encode())


def same_origin(request: Request) -> bool:
    """Whether a form POST comes from this very site (browsers send ``Origin`` on a
    POST; a client without it, like curl, is not a browser tricked by another site)."""
    origin = request.headers.get("origin")
    if origin is None or origin == "null":
        return origin is None
    return urlsplit(origin).netloc == request.headers.get("host", "")


def new_csrf() -> str:
    """A fresh CSRF token for the ``sw_ui_csrf`` cookie."""
    return secrets.token_urlsafe(32)


def _sign(token: bytes, expiry: str) -> str:
    return hmac.new(token, _CONTEXT + expiry.encode(), hashlib.sha256).hexdigest()
