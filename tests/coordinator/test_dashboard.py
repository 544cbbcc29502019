"""The ``/ui`` dashboard over real HTTP: who may see it, what it shows, and that no
token ever reaches a page, a cookie or a log (the browser test drives it in Chromium:
``tests/browser/``)."""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from streamworks import App
from streamworks.coordinator.dashboard.auth import COOKIE, SESSION_SECONDS, DashboardAuth
from streamworks.coordinator.service import CoordinatorService
from streamworks.redis.client import create_redis
from streamworks.redis.keyspace import Keyspace
from streamworks.settings import Settings
from streamworks.testing import TestRuntime
from streamworks.testing.runtime import fast_settings
from tests.coordinator.harness import recording_redis, serve_api
from tests.coordinator.test_no_message_access import MESSAGE_COMMANDS
from tests.e2e.harness import Cluster, free_port, wait_ready

MEMBER_TOKEN = "member-0c6a1f93e27b5d48"
ADMIN_TOKEN = "admin-5e2d8b17a96c04f3"
VIEWER_TOKEN = "viewer-a3f09c4d1e7b6285"
TOKENS = (MEMBER_TOKEN, ADMIN_TOKEN, VIEWER_TOKEN)


def _app() -> App:
    app = App("shop")
    app.stream("orders", shards=3)

    @app.handler("orders")
    async def handle(value: Any) -> None: ...

    return app


@pytest.fixture
async def runtime(streamworks_redis_url: str, settings: Settings) -> AsyncIterator[TestRuntime]:
    secured = fast_settings(
        settings,
        token=SecretStr(MEMBER_TOKEN),
        admin_token=SecretStr(ADMIN_TOKEN),
        viewer_token=SecretStr(VIEWER_TOKEN),
    )
    async with TestRuntime(
        _app(), http=True, redis_url=streamworks_redis_url, settings=secured, workers=2
    ) as rt:
        await rt.wait_assigned()
        yield rt


async def _login(http: httpx.AsyncClient, token: str) -> httpx.Response:
    return await http.post("/ui/login", data={"token": token})


async def test_the_dashboard_needs_a_token_and_never_shows_one(
    runtime: TestRuntime, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    bodies: list[str] = []
    async with httpx.AsyncClient(base_url=runtime.http_url) as http:
        # No credentials: the login form with 401, and no data of the namespace.
        refused = await http.get("/ui/")
        assert refused.status_code == 401
        assert 'name="token"' in refused.text and "orders" not in refused.text
        assert (await http.get("/ui/panels")).status_code == 401
        # A wrong token, as a bearer, as the form, as a forged or expired cookie.
        wrong = {"authorization": f"Bearer {MEMBER_TOKEN}x"}
        assert (await http.get("/ui/", headers=wrong)).status_code == 401
        failed = await _login(http, VIEWER_TOKEN[:-1])
        assert failed.status_code == 401 and "wrong token" in failed.text
        assert COOKIE not in failed.cookies
        forged = {"cookie": f"{COOKIE}=v1.99999999999.{'0' * 64}"}
        assert (await http.get("/ui/", headers=forged)).status_code == 401
        bodies += [refused.text, failed.text]
        # The viewer token opens the dashboard only: the API refuses it.
        viewer = {"authorization": f"Bearer {VIEWER_TOKEN}"}
        assert (await http.get("/v1/status", headers=viewer)).status_code == 401

    for token in TOKENS:
        async with httpx.AsyncClient(base_url=runtime.http_url) as http:
            # A bearer token works for scripts...
            page = await http.get("/ui/", headers={"authorization": f"Bearer {token}"})
            assert page.status_code == 200, token
            # ...and the form exchanges one for a session cookie that is not the token.
            logged_in = await _login(http, token)
            assert logged_in.status_code == 303 and logged_in.headers["location"] == "/ui/"
            set_cookie = logged_in.headers["set-cookie"]
            assert "HttpOnly" in set_cookie and "SameSite=strict" in set_cookie
            assert "Path=/ui" in set_cookie
            session = http.cookies[COOKIE]
            assert token not in session and re.fullmatch(r"v1\.\d+\.[0-9a-f]{64}", session)
            page = await http.get("/ui/")
            panels = await http.get("/ui/panels")
            assert page.status_code == 200 and panels.status_code == 200
            bodies += [page.text, panels.text, set_cookie]
            # Logging out clears it.
            out = await http.post("/ui/logout")
            assert out.status_code == 303 and COOKIE not in http.cookies
            assert (await http.get("/ui/")).status_code == 401
    logged = [r.getMessage() + (r.exc_text or "") for r in caplog.records]
    for token in TOKENS:
        assert not [b for b in bodies + logged if token in b], token


async def test_a_login_posted_from_another_site_is_refused(runtime: TestRuntime) -> None:
    async with httpx.AsyncClient(base_url=runtime.http_url) as http:
        response = await http.post(
            "/ui/login", data={"token": VIEWER_TOKEN}, headers={"origin": "https://evil.example"}
        )
        assert response.status_code == 403 and COOKIE not in http.cookies
        huge = await http.post("/ui/login", content=b"token=" + b"a" * 10_000)
        assert huge.status_code == 413


async def test_the_page_shows_groups_members_the_shard_map_and_dead_letters(
    runtime: TestRuntime,
) -> None:
    keyspace = Keyspace(runtime.settings.key_prefix)
    for n in range(3):  # dead letters, as a worker writes them
        await runtime.redis.xadd(keyspace.dead_letters("shop", "orders"), {"n": str(n)})
    for n in range(5):
        await runtime.app.publish("orders", {"n": n}, key=f"k{n}")
    await runtime.wait_idle()
    viewer = {"authorization": f"Bearer {VIEWER_TOKEN}"}
    async with httpx.AsyncClient(base_url=runtime.http_url, headers=viewer) as http:
        page = (await http.get("/ui/")).text
        panels = (await http.get("/ui/panels")).text
        script = await http.get("/ui/static/refresh.js")
        css = await http.get("/ui/static/dashboard.css")
        missing = await http.get("/ui/static/..%2Fauth.py")
    assert 'data-group="shop" data-state="STABLE"' in page
    members = {w.member_id for w in runtime.workers}
    owners = set(re.findall(r'class="shard [^"]*"[^>]*data-owner="([^"]*)"', page, re.S))
    assert owners == members, (owners, members)
    shards = re.findall(r'data-stream="orders" data-shard="(orders/\d+@\d+)"', page)
    assert sorted(shards) == ["orders/0@0", "orders/1@0", "orders/2@0"]
    assert 'data-group="shop" data-stream="orders" data-entries="3"' in page
    assert "<svg" in page and 'class="lag"' in page
    assert 'id="panels"' in page and 'id="panels"' not in panels  # a fragment
    assert 'data-group="shop" data-stream="orders" data-entries="3"' in panels
    assert script.status_code == 200 and "fetch(" in script.text
    assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")
    assert missing.status_code == 404
    assert "script-src 'self'" in (await _headers(runtime))["content-security-policy"]


async def _headers(runtime: TestRuntime) -> httpx.Headers:
    async with httpx.AsyncClient(base_url=runtime.http_url) as http:
        return (await http.get("/ui/login")).headers


async def test_sessions_expire_and_die_with_the_token() -> None:
    now = [1_000_000.0]
    settings = Settings(viewer_token=SecretStr("v1-token"))
    auth = DashboardAuth(settings, now=lambda: now[0])
    session = auth.session_for("v1-token")
    assert session is not None and "v1-token" not in session
    assert auth.valid_session(session)
    assert auth.session_for("v1-tokeN") is None
    # Another replica with the same token accepts it; one with another token does not.
    assert DashboardAuth(settings, now=lambda: now[0]).valid_session(session)
    rotated = DashboardAuth(Settings(viewer_token=SecretStr("v2-token")), now=lambda: now[0])
    assert not rotated.valid_session(session)
    # A tampered expiry breaks the signature; time passing ends it.
    version, expiry, signature = session.split(".")
    assert not auth.valid_session(f"{version}.{int(expiry) + 3600}.{signature}")
    now[0] += SESSION_SECONDS + 1
    assert not auth.valid_session(session)
    # No token configured: the dashboard is open.
    assert not DashboardAuth(Settings()).required


@pytest.mark.seed("E24")
async def test_the_dashboard_and_metrics_read_no_message(
    runtime: TestRuntime, streamworks_redis_url: str
) -> None:
    """Everything the dashboard and the status gauges show comes from lengths and
    ``XINFO``: a replica whose Redis client records every command serves both, and
    sends no command that reads, writes or deletes an entry."""
    keyspace = Keyspace(runtime.settings.key_prefix)
    await runtime.redis.xadd(keyspace.dead_letters("shop", "orders"), {"n": "1"})
    for n in range(5):
        await runtime.app.publish("orders", {"n": n}, key=f"k{n}")
    real = create_redis(runtime.settings)
    recording = recording_redis(real)
    try:
        replica = CoordinatorService(recording, runtime.settings, replica="recorded")
        async with serve_api(replica) as url:
            viewer = {"authorization": f"Bearer {VIEWER_TOKEN}"}
            async with httpx.AsyncClient(base_url=url, headers=viewer) as http:
                page = await http.get("/ui/")
                metrics = await http.get("/metrics")
    finally:
        await recording.aclose()
        await real.aclose()
    assert page.status_code == 200 and 'data-entries="1"' in page.text
    assert "streamworks_coordinator_dead_letters" in metrics.text
    names = {c[0] for c in recording.commands}
    assert {"XLEN", "XINFO GROUPS"} <= names, names
    assert not names & MESSAGE_COMMANDS, names & MESSAGE_COMMANDS


async def test_the_coordinator_command_takes_a_viewer_token(
    settings: Settings, redis: Any, tmp_path: Path
) -> None:
    cluster = Cluster(settings.redis_url, settings.key_prefix, tmp_path)
    try:
        port = free_port()
        coordinator = cluster.start(
            "coordinator", "coordinator", "--port", str(port), "--viewer-token", VIEWER_TOKEN
        )
        coordinator.url = f"http://127.0.0.1:{port}"
        await wait_ready(coordinator)
        async with httpx.AsyncClient(base_url=coordinator.url) as http:
            assert (await http.get("/ui/")).status_code == 401
            ok = await http.get("/ui/", headers={"authorization": f"Bearer {VIEWER_TOKEN}"})
            assert ok.status_code == 200 and 'id="panels"' in ok.text
    finally:
        cluster.kill_all()
    assert VIEWER_TOKEN not in coordinator.output()
