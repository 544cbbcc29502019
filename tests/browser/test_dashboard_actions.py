"""A dashboard that can act (issue 22, item 12), in headless Chromium against a real
coordinator and two real worker groups on one stream.

A dead letter replayed from the page (select, preview, confirm) is handled once, by its
group only: the other group, which dead-lettered the same message, never runs it
again. Only the admin token acts: the viewer sees no action and is refused one; every
action is a POST with the browser's CSRF token, from the same origin, confirmed in the
page and logged with who and what. Scaling to 0 shards must be acknowledged. The
members' own metrics give each group's handled/s; ``GET /`` leads to the dashboard,
whose URL the coordinator logs at start.
"""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from streamworks import App
from streamworks.protocol.client import CoordinatorClient
from streamworks.redis.keyspace import Keyspace
from tests.browser.test_dashboard import wait_page
from tests.e2e.apps import instrumented
from tests.e2e.harness import (
    GROUP,
    STREAM,
    Cluster,
    event,
    processings,
    wait_ready,
    wait_stable,
    wait_until,
)

pytestmark = pytest.mark.timeout(240)

MEMBER_TOKEN = "member-5c1e0d9b7a2f4e68"
ADMIN_TOKEN = "admin-0b4d8e2c6a9f1735"
VIEWER_TOKEN = "viewer-9e3a7c1f5b2d8064"
OTHER = "e2e-other"  # the second group on the stream


async def log_in(driver: Any, ui: str, token: str) -> None:
    from selenium.webdriver.common.by import By

    driver.delete_all_cookies()
    driver.get(ui)
    driver.find_element(By.ID, "token").send_keys(token)
    driver.find_element(By.CSS_SELECTOR, "#login button").click()
    await wait_page(driver, lambda d: d.find_elements(By.ID, "panels"), 10, "the dashboard")


def click(driver: Any, css: str) -> None:
    from selenium.webdriver.common.by import By

    driver.find_element(By.CSS_SELECTOR, css).click()


async def test_replay_from_the_page_reaches_its_group_only(
    cluster: Cluster, browser: Any, redis: Any
) -> None:
    from selenium.webdriver.common.by import By

    driver = browser
    cluster.base_env.update(
        {"STREAMWORKS_TOKEN": MEMBER_TOKEN, "STREAMWORKS_ADMIN_TOKEN": ADMIN_TOKEN}
    )
    coordinator = cluster.start_coordinator(STREAMWORKS_VIEWER_TOKEN=VIEWER_TOKEN)
    await wait_ready(coordinator)
    base, ui = coordinator.url, f"{coordinator.url}/ui/"
    assert f"dashboard: {ui}" in coordinator.output()  # logged at start
    keyspace = Keyspace(cluster.prefix)
    async with (
        CoordinatorClient([base], token=MEMBER_TOKEN, admin_token=ADMIN_TOKEN) as client,
        httpx.AsyncClient(base_url=base, follow_redirects=False) as http,
    ):
        assert (await http.get("/")).headers["location"] == "/ui/"
        await client.create_stream(STREAM, instrumented.SHARDS)
        cluster.start_worker("ours")
        cluster.start_worker("theirs", E2E_GROUP=OTHER)
        await wait_stable(client, 1)
        await wait_stable(client, 1, group=OTHER)

        # One message both groups fail on until it is healed: a dead letter in each.
        app = App("actions-producer", settings=cluster.settings(token=SecretStr(MEMBER_TOKEN)))
        app.stream(STREAM, shards=instrumented.SHARDS)
        async with app.connect():
            await app.publish_many(STREAM, [event("x-01", fail_until_healed=True)])
            await app.publish_many(STREAM, [event(f"ok-{i:02d}") for i in range(40)])

        async def dead_lettered() -> bool:
            lengths = [await redis.xlen(keyspace.dead_letters(g, STREAM)) for g in (GROUP, OTHER)]
            return lengths == [1, 1]

        await wait_until(dead_lettered, 30, "a dead letter in each group")
        [(ours, _)] = await redis.xrange(keyspace.dead_letters(GROUP, STREAM))
        ours_id = ours.decode()
        await redis.set(instrumented.healed_key(cluster.prefix, "x-01"), 1)
        members = {
            g: {m.member_id for m in (await client.group(g)).members} for g in (GROUP, OTHER)
        }
        before = [p for p in await processings(redis, cluster.prefix) if p.id == "x-01"]
        assert {p.member for p in before} == members[GROUP] | members[OTHER]
        assert all(p.end is None for p in before)  # every attempt failed

        # -- the viewer: sees, cannot act ---------------------------------------------
        await log_in(driver, ui, VIEWER_TOKEN)
        await wait_page(
            driver,
            lambda d: d.find_elements(By.CSS_SELECTOR, f'#dead-letters tr[data-group="{GROUP}"]'),
            15,
            "the dead letters panel",
        )
        assert not driver.find_elements(By.CSS_SELECTOR, "a.action")
        driver.get(f"{base}/ui/dlq/{GROUP}/{STREAM}")
        assert "admin token" in driver.find_element(By.ID, "action-error").text
        viewer = {"authorization": f"Bearer {VIEWER_TOKEN}"}
        refused = await http.post(
            f"/ui/dlq/{GROUP}/{STREAM}/replay", headers=viewer, data={"id": ours_id}
        )
        assert refused.status_code == 403

        # -- the admin: select, preview (a dry run), confirm ----------------------------
        await log_in(driver, ui, ADMIN_TOKEN)
        link = f'#dead-letters tr[data-group="{GROUP}"] a.action.dlq'
        await wait_page(driver, lambda d: d.find_elements(By.CSS_SELECTOR, link), 15, "the link")
        click(driver, link)
        await wait_page(driver, lambda d: d.find_elements(By.ID, "dlq"), 10, "the DLQ page")
        rows = driver.find_elements(By.CSS_SELECTOR, "#entries tr.entry")
        assert [r.get_attribute("data-id") for r in rows] == [ours_id]
        # Narrowed like the CLI: a reason that does not match selects nothing.
        driver.get(f"{base}/ui/dlq/{GROUP}/{STREAM}?reason=poison")
        assert driver.find_elements(By.ID, "no-entries")
        driver.get(f"{base}/ui/dlq/{GROUP}/{STREAM}?reason=max_attempts&error=NotHealed")
        click(driver, "#preview-replay")
        await wait_page(driver, lambda d: d.find_elements(By.ID, "confirm"), 10, "the preview")
        planned = driver.find_elements(By.CSS_SELECTOR, "#plan tr.planned")
        assert [p.get_attribute("data-id") for p in planned] == [ours_id]
        assert f"to {GROUP} on {STREAM}/" in planned[0].text
        assert await redis.xlen(keyspace.dead_letters(GROUP, STREAM)) == 1  # a dry run
        click(driver, "#confirm-button")
        result = await wait_page(
            driver, lambda d: d.find_elements(By.ID, "action-result"), 15, "the result"
        )
        assert f"Replayed 1 dead letter to group {GROUP} only" in result[0].text

        # Handled once, by its group only; the other group's dead letter stays.
        async def handled_once() -> list[Any] | None:
            done = [
                p
                for p in await processings(redis, cluster.prefix)
                if p.id == "x-01" and p.end is not None
            ]
            return done or None

        [handled] = await wait_until(handled_once, 30, "the replay to be handled")
        assert handled.member in members[GROUP]
        assert handled.attempt == 1
        after = [p for p in await processings(redis, cluster.prefix) if p.id == "x-01"]
        assert len(after) == len(before) + 1, after  # exactly one more run, of our group
        assert await redis.xlen(keyspace.dead_letters(GROUP, STREAM)) == 0
        assert await redis.xlen(keyspace.dead_letters(OTHER, STREAM)) == 1
        logged = re.search(
            rf"dashboard: replay 1 dead letter of {GROUP}/{STREAM} by admin \(session "
            rf"[0-9a-f]{{8}}, from 127\.0\.0\.1\): {ours_id}→{STREAM}/\d+@0",
            coordinator.output(),
        )
        assert logged, coordinator.output()[-3000:]

        # -- every action needs the CSRF token and the same origin ----------------------
        admin = {"authorization": f"Bearer {ADMIN_TOKEN}"}
        [(theirs, _)] = await redis.xrange(keyspace.dead_letters(OTHER, STREAM))
        form = {"id": theirs.decode(), "confirm": "yes"}
        no_csrf = await http.post(f"/ui/dlq/{OTHER}/{STREAM}/delete", headers=admin, data=form)
        assert no_csrf.status_code == 403 and "CSRF" in no_csrf.text
        cross_site = await http.post(
            f"/ui/dlq/{OTHER}/{STREAM}/delete",
            headers={**admin, "origin": "http://evil.example", "cookie": "sw_ui_csrf=" + "c" * 43},
            data={**form, "csrf": "c" * 43},
        )
        assert cross_site.status_code == 403
        assert await redis.xlen(keyspace.dead_letters(OTHER, STREAM)) == 1

        # -- scaling: previewed, confirmed; 0 shards must be acknowledged ----------------
        driver.get(ui)
        scale = f'#streams tr[data-stream="{STREAM}"] a.action.scale'
        await wait_page(driver, lambda d: d.find_elements(By.CSS_SELECTOR, scale), 15, "scale")
        click(driver, scale)
        await wait_page(driver, lambda d: d.find_elements(By.ID, "scale-form"), 10, "the form")
        driver.find_element(By.ID, "shards").clear()
        driver.find_element(By.ID, "shards").send_keys("0")
        click(driver, "#preview-scale")
        await wait_page(driver, lambda d: d.find_elements(By.ID, "acknowledge"), 10, "the box")
        assert driver.find_element(By.ID, "acknowledge").get_attribute("required") is not None
        token = driver.find_element(By.CSS_SELECTOR, "#confirm-form input[name=csrf]")
        unacknowledged = await http.post(
            f"/ui/streams/{STREAM}/scale",
            headers={**admin, "cookie": "sw_ui_csrf=" + "d" * 43},
            data={"csrf": "d" * 43, "confirm": "yes", "shards": "0"},
        )
        assert unacknowledged.status_code == 400 and "acknowledged" in unacknowledged.text
        assert token.get_attribute("value")  # the page's own form carries the token
        driver.get(f"{base}/ui/streams/{STREAM}/scale")
        driver.find_element(By.ID, "shards").clear()
        driver.find_element(By.ID, "shards").send_keys(str(instrumented.SHARDS + 1))
        click(driver, "#preview-scale")
        await wait_page(driver, lambda d: d.find_elements(By.ID, "confirm-button"), 10, "confirm")
        click(driver, "#confirm-button")
        await wait_page(driver, lambda d: d.find_elements(By.ID, "action-result"), 15, "scaled")
        assert (await client.stream(STREAM)).shard_count == instrumented.SHARDS + 1
        assert re.search(rf"dashboard: scale {STREAM} to 7 shards by admin", coordinator.output())

        # -- throughput from the members' own /metrics ----------------------------------
        driver.get(ui)

        def rates(d: Any) -> dict[str, tuple[str, str]] | None:
            found = {
                r.get_attribute("data-group"): (
                    r.get_attribute("data-handled"),
                    r.find_elements(By.CSS_SELECTOR, "td")[4].text,
                )
                for r in d.find_elements(By.CSS_SELECTOR, "#throughput tr.rate")
            }
            ready = len(found) == 2 and all(h.endswith("/s") for h, _ in found.values())
            return found if ready else None

        shown = await wait_page(driver, rates, 20, "each group's handled/s")
        assert {g: read for g, (_, read) in shown.items()} == {GROUP: "1 of 1", OTHER: "1 of 1"}
        links = driver.find_elements(By.CSS_SELECTOR, "#members a.metrics")
        assert len(links) == 2
        assert all(
            re.fullmatch(r"http://127\.0\.0\.1:\d+/metrics", a.get_attribute("href")) for a in links
        )
