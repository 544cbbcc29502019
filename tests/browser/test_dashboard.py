"""The dashboard in a real browser: headless Chromium against a real coordinator
process with three real worker processes.

It logs in through the form (no token and a wrong token are refused), finds the
workers in the shard map, sees the map change on its own (live refresh, no reload)
after a worker is SIGKILLed and while a scale-in migrates, and checks that no token
is in the page, the cookie or anything script can read. Every wait is on a condition
of the page, with a deadline.
"""

from __future__ import annotations

import base64
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import anyio.to_thread
import httpx
import pytest
from pydantic import SecretStr

from streamworks import App
from streamworks.protocol.client import CoordinatorClient
from streamworks.redis.keyspace import Keyspace
from tests.e2e.apps import instrumented
from tests.e2e.harness import (
    GROUP,
    STREAM,
    Cluster,
    event,
    wait_ready,
    wait_stable,
)

pytestmark = pytest.mark.timeout(180)

MEMBER_TOKEN = "member-b7e4c19a05d2f368"
ADMIN_TOKEN = "admin-2f9d06c8e3a17b54"
VIEWER_TOKEN = "viewer-64c0e8a3d9b27f15"
TOKENS = (MEMBER_TOKEN, ADMIN_TOKEN, VIEWER_TOKEN)
T = TypeVar("T")

#: Every shard cell of the map as [group, stream, shard, state, owner pid], read in
#: one script call (the panels are swapped every 2 s; element handles go stale).
READ_MAP = """
return Array.from(document.querySelectorAll('#shard-map .shard')).map(
  e => [e.dataset.group, e.dataset.stream, e.dataset.shard, e.dataset.state, e.dataset.pid]);
"""
READ_MIGRATIONS = """
return Array.from(document.querySelectorAll('#migrations .migration')).map(
  e => [e.dataset.stream, e.dataset.phase,
        Array.from(e.querySelectorAll('li')).map(li => li.dataset.shard + ': ' + li.textContent)]);
"""


async def wait_page(driver: Any, probe: Callable[[Any], T], timeout: float, what: str) -> T:
    """Poll ``probe(driver)`` (in a thread: Selenium blocks) until it returns something
    truthy; fail with ``what`` and the last value after ``timeout`` seconds."""
    from selenium.common.exceptions import TimeoutException, WebDriverException
    from selenium.webdriver.support.ui import WebDriverWait

    last: list[Any] = [None]

    def recorded(d: Any) -> T:
        last[0] = probe(d)
        return last[0]

    def run() -> T:
        try:
            return WebDriverWait(
                driver, timeout, poll_frequency=0.1, ignored_exceptions=(WebDriverException,)
            ).until(recorded)
        except TimeoutException:
            raise AssertionError(f"timed out after {timeout}s: {what} (last: {last[0]})") from None

    return await anyio.to_thread.run_sync(run)


def shard_map(driver: Any) -> dict[str, tuple[str, str]]:
    """shard -> (state, owner pid) in the map of the instrumented group's stream."""
    return {
        shard: (state, pid)
        for group, stream, shard, state, pid in driver.execute_script(READ_MAP)
        if group == GROUP and stream == STREAM
    }


def screenshot(driver: Any, dirs: list[Path], name: str) -> None:
    """The whole page, beyond the window's height, as ``dashboard-<name>.png``."""
    size = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
    width = max(size["width"], driver.execute_script("return window.innerWidth"))
    shot = driver.execute_cdp_cmd(
        "Page.captureScreenshot",
        {
            "format": "png",
            "captureBeyondViewport": True,
            "clip": {"x": 0, "y": 0, "width": width, "height": size["height"], "scale": 1},
        },
    )
    for d in dirs:
        (d / f"dashboard-{name}.png").write_bytes(base64.b64decode(shot["data"]))


def samples_shown(driver: Any) -> int:
    """The most samples any sparkline of the page draws."""
    counts = driver.execute_script(
        "return Array.from(document.querySelectorAll('#positions polyline.lag'))"
        ".map(p => p.getAttribute('points').split(' ').length)"
    )
    return max(counts, default=0)


def assert_no_token(driver: Any) -> None:
    source = driver.page_source
    readable = str(driver.execute_script("return document.cookie + JSON.stringify(localStorage)"))
    cookies = str(driver.get_cookies())
    for token in TOKENS:
        assert token not in source and token not in readable and token not in cookies


async def test_the_dashboard_in_chromium(
    cluster: Cluster, browser: Any, screenshots: list[Path], redis: Any
) -> None:
    from selenium.webdriver.common.by import By

    driver = browser
    cluster.base_env.update(
        {"STREAMWORKS_TOKEN": MEMBER_TOKEN, "STREAMWORKS_ADMIN_TOKEN": ADMIN_TOKEN}
    )
    coordinator = cluster.start_coordinator(STREAMWORKS_VIEWER_TOKEN=VIEWER_TOKEN)
    await wait_ready(coordinator)
    ui = f"{coordinator.url}/ui/"
    async with CoordinatorClient(
        [coordinator.url], token=MEMBER_TOKEN, admin_token=ADMIN_TOKEN
    ) as client:
        await client.create_stream(STREAM, instrumented.SHARDS)
        workers = [cluster.start_worker(f"worker-{i}", E2E_SLEEP="0.25") for i in range(3)]
        await wait_stable(client, 3)
        pids = {str(w.pid) for w in workers}

        # -- no token, a wrong token: refused ----------------------------------------
        async with httpx.AsyncClient() as http:
            assert (await http.get(ui)).status_code == 401
            wrong = {"authorization": f"Bearer {VIEWER_TOKEN}0"}
            assert (await http.get(ui, headers=wrong)).status_code == 401
        driver.get(ui)
        assert driver.find_elements(By.ID, "login") and not driver.find_elements(By.ID, "panels")
        assert STREAM not in driver.page_source and GROUP not in driver.page_source
        screenshot(driver, screenshots, "login")
        driver.find_element(By.ID, "token").send_keys(VIEWER_TOKEN + "0")
        driver.find_element(By.CSS_SELECTOR, "#login button").click()
        error = await wait_page(
            driver, lambda d: d.find_elements(By.ID, "login-error"), 10, "the login error"
        )
        assert error[0].text == "wrong token"
        assert not driver.find_elements(By.ID, "panels") and not driver.get_cookies()

        # -- the token: the dashboard, and the workers in its shard map ---------------
        driver.find_element(By.ID, "token").send_keys(VIEWER_TOKEN)
        driver.find_element(By.CSS_SELECTOR, "#login button").click()
        await wait_page(driver, lambda d: d.find_elements(By.ID, "panels"), 10, "the dashboard")
        assert driver.current_url == ui
        first = await wait_page(
            driver,
            lambda d: (m := shard_map(d)) and {p for _, p in m.values()} == pids and m,
            20,
            "every worker in the shard map",
        )
        assert len(first) == instrumented.SHARDS
        assert_no_token(driver)
        cookies = {c["name"]: c for c in driver.get_cookies()}
        assert set(cookies) == {"sw_ui_session", "sw_ui_csrf"}, cookies  # session, CSRF
        for cookie in cookies.values():
            assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
            assert cookie["path"] == "/ui"

        # A backlog (each message takes 0.25 s), so pending, lag and sparklines move.
        app = App("browser-producer", settings=cluster.settings(token=SecretStr(MEMBER_TOKEN)))
        app.stream(STREAM, shards=instrumented.SHARDS)
        async with app.connect():
            for batch in range(8):
                records = [event(f"b{batch}-{i:04d}") for i in range(150)]
                await app.publish_many(STREAM, records)
        await wait_page(driver, lambda d: samples_shown(d) >= 4, 20, "sparklines of 4 samples")
        keyspace = Keyspace(cluster.prefix)
        for n in range(3):  # dead letters, as a worker writes them
            await redis.xadd(keyspace.dead_letters(GROUP, STREAM), {"n": str(n)})
        await wait_page(
            driver,
            lambda d: d.find_elements(By.CSS_SELECTOR, '#dead-letters tr[data-entries="3"]'),
            15,
            "the dead letters",
        )
        screenshot(driver, screenshots, "overview")

        # -- a worker SIGKILLed: its shards move to the others, the page follows -------
        killed = workers[0]
        killed.send(signal.SIGKILL)
        await killed.wait_exit(10)
        survivors = pids - {str(killed.pid)}
        moved = await wait_page(
            driver,
            lambda d: (
                (m := shard_map(d))
                and len(m) == instrumented.SHARDS
                and {p for _, p in m.values()} == survivors
                and m
            ),
            40,
            "the killed worker's shards to move to the survivors",
        )
        assert moved != first
        url_before = driver.current_url
        assert (
            driver.execute_script("return performance.getEntriesByType('navigation').length") == 1
        )

        # -- a scale-in: the migration panel, then the smaller map --------------------
        await client.scale_stream(STREAM, 4)
        migration = await wait_page(
            driver,
            lambda d: [m for m in d.execute_script(READ_MIGRATIONS) if m[0] == STREAM],
            15,
            "the migration in the migrations panel",
        )
        _, phase, draining = migration[0]
        assert phase in ("FENCING", "DRAINING")
        assert sorted(line.split(":", 1)[0] for line in draining) == [
            f"{STREAM}/4@0",
            f"{STREAM}/5@0",
        ]
        assert all("waits for" in line for line in draining)
        draining_cells = await wait_page(
            driver,
            lambda d: [s for s, (state, _) in shard_map(d).items() if state == "DRAINING"],
            15,
            "draining shards in the map",
        )
        assert sorted(draining_cells) == [f"{STREAM}/4@0", f"{STREAM}/5@0"]
        screenshot(driver, screenshots, "migration")
        after = await wait_page(
            driver,
            lambda d: (
                (m := shard_map(d)) and len(m) == 4 and not d.execute_script(READ_MIGRATIONS) and m
            ),
            60,
            "the migration to complete",
        )
        assert sorted(after) == [f"{STREAM}/{i}@0" for i in range(4)]
        assert {p for _, p in after.values()} <= survivors
        # All of it live: the page was never reloaded.
        assert driver.current_url == url_before
        assert (
            driver.execute_script("return performance.getEntriesByType('navigation').length") == 1
        )
        assert_no_token(driver)

        # -- logged out: refused again ------------------------------------------------
        driver.find_element(By.CSS_SELECTOR, "form.logout button").click()
        await wait_page(driver, lambda d: d.find_elements(By.ID, "login"), 10, "the login form")
        driver.get(ui)
        assert driver.find_elements(By.ID, "login") and not driver.find_elements(By.ID, "panels")
