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
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Callable

from starlette.requests import Request

from streamworks.settings import Settings

__all__ = ("COOKIE", "SESSION_SECONDS", "DashboardAuth")

COOKIE = "sw_ui_session"
SESSION_SECONDS = 12 * 3600
_CONTEXT = b"streamworks/ui-session/v1/"


class DashboardAuth:
    """Checks tokens and session cookies for one replica's settings.

    Args:
        settings: the replica's settings (its viewer, member and admin tokens).
        now: wall-clock time in seconds (sessions are checked by every replica, so
            they expire on the wall clock, not a replica's monotonic one).
    """

    def __init__(self, settings: Settings, now: Callable[[], float] = time.time) -> None:
        secrets_ = (settings.viewer_token, settings.token, settings.admin_token)
        self._tokens = [s.get_secret_value().encode() for s in secrets_ if s is not None]
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
        version, _, rest = value.partition(".")
        expiry, _, signature = rest.partition(".")
        if version != "v1" or not expiry.isdigit() or int(expiry) <= self._now():
            return False
        valid = False
        for token in self._tokens:
            if secrets.compare_digest(_sign(token, expiry).encode(), signature.encode()):
                valid = True
        return valid

    def allows(self, request: Request) -> bool:
        """Whether the request carries a valid bearer token or session cookie."""
        if not self._tokens:
            return True
        scheme, _, presented = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and presented:
            return self._matching(presented) is not None
        cookie = request.cookies.get(COOKIE)
        return cookie is not None and self.valid_session(cookie)


def _sign(token: bytes, expiry: str) -> str:
    return hmac.new(token, _CONTEXT + expiry.encode(), hashlib.sha256).hexdigest()
