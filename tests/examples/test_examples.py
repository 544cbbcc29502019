"""Every example under examples/ runs, against a real Redis and real coordinators, and
does what docs/examples.md says it does."""

from __future__ import annotations

import contextlib
import os
import socket
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import anyio
import httpx
import pytest
import uvicorn

from examples.cron_report import app as cron_report
from examples.cron_report import demo as cron_report_demo
from examples.fanout import apps as fanout
from examples.idempotency import demo as idempotency_demo
from examples.idempotency.ledger import Ledger
from examples.webapps import events
from streamworks import App, Settings
from streamworks.testing import TestRuntime
from tests.support import wait_for

POSTGRES_DEFAULT = "postgresql://postgres@127.0.0.1:5432/postgres"


@pytest.fixture
def redis_env(streamworks_redis_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """Examples that start their own TestRuntime use the session's Redis."""
    monkeypatch.setenv("STREAMWORKS_TEST_REDIS_URL", streamworks_redis_url)
    return streamworks_redis_url


async def test_fanout_each_group_handles_every_event(redis_env: str) -> None:
    await fanout.main()
    assert len(fanout.packed) == len(set(fanout.packed)) == 100
    assert fanout.revenue.total() == sum(range(100))


async def test_cron_report_publishes_one_report_per_hour(redis_env: str) -> None:
    await cron_report_demo.main()
    assert [r.orders for r in cron_report.delivered] == [10, 5]
    ends = [r.end for r in cron_report.delivered]
    assert ends[1] - ends[0] == timedelta(hours=1) and ends[0].minute == ends[0].second == 0


async def test_idempotency_on_sqlite(redis_env: str, tmp_path: Path) -> None:
    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    try:
        balances = await idempotency_demo.run(ledger)
    finally:
        ledger.close()
    assert sum(balances.values()) == sum(100 + n for n in range(60))


def postgres_url() -> str | None:
    """STREAMWORKS_TEST_POSTGRES_URL, else the local server if one answers."""
    url = os.environ.get("STREAMWORKS_TEST_POSTGRES_URL")
    if url:
        return url
    try:
        with socket.create_connection(("127.0.0.1", 5432), timeout=1):
            return POSTGRES_DEFAULT
    except OSError:
        return None


@pytest.fixture
def postgres_database() -> Iterator[str]:
    """A database of this test's own on the Postgres server, dropped afterwards."""
    url = postgres_url()
    if url is None:
        pytest.skip("no Postgres: set STREAMWORKS_TEST_POSTGRES_URL or run one on :5432")
    psycopg = pytest.importorskip("psycopg")
    name = f"sw_ledger_{uuid.uuid4().hex[:10]}"
    try:
        admin = psycopg.connect(url, autocommit=True)
    except psycopg.OperationalError as e:
        if os.environ.get("STREAMWORKS_TEST_POSTGRES_URL"):
            raise
        pytest.skip(f"the Postgres on 127.0.0.1:5432 refused the connection: {e}")
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        try:
            yield urlunsplit(urlsplit(url)._replace(path=f"/{name}"))
        finally:
            admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


async def test_idempotency_on_postgres(redis_env: str, postgres_database: str) -> None:
    ledger = Ledger(postgres_database)
    try:
        balances = await idempotency_demo.run(ledger)
    finally:
        ledger.close()
    assert sum(balances.values()) == sum(100 + n for n in range(60))


async def test_orders_load_generator(streamworks_redis_url: str) -> None:
    """examples.orders.load (the compose file's load service) publishes what it says;
    the billing app charges each order or dead-letters it."""
    from examples.orders import app as orders
    from examples.orders.load import publish_orders

    # acl=False: the example's handler keeps its demo data (demo:*) through streamworks'
    # own connection, which a worker's least-privilege user may not (docs/security.md).
    async with TestRuntime(orders.app, workers=1, redis_url=streamworks_redis_url, acl=False) as rt:
        charged_key = f"demo:charged:{orders.app.name}"
        await rt.redis.delete(charged_key, f"demo:by-member:{orders.app.name}")
        try:
            assert await publish_orders(count=120, rate=2000, seed=3) == 120
            await rt.wait_idle(timeout=20)
            dead = await rt.dead_letters("orders")
            assert await rt.redis.scard(charged_key) + len(dead) == 120
            assert all(d.reason == "max_attempts" for d in dead)
        finally:
            await rt.redis.delete(
                charged_key,
                f"demo:by-member:{orders.app.name}",
                f"demo:duplicates:{orders.app.name}",
            )


# -- web apps ------------------------------------------------------------------------------
def producer_for(rt: TestRuntime) -> App:
    """The web process's own App: same declarations, talking to the runtime's
    coordinator over HTTP and its Redis, as a separate service would."""
    assert rt.http_url is not None
    return events.build_app(
        Settings(
            redis_url=rt.settings.redis_url,
            key_prefix=rt.settings.key_prefix,
            coordinator_urls=[rt.http_url],
        )
    )


SIGNUPS = [
    ({"email": "ada@example.org", "name": "Ada"}, {"Idempotency-Key": "req-1"}),
    ({"email": "ada@example.org", "name": "Ada"}, {"Idempotency-Key": "req-1"}),  # retried
    ({"email": "alan@example.org", "name": "Alan"}, {}),
    ({"email": "not-an-address", "name": "Bob"}, {}),
]


def check_answers(answers: list[tuple[int, dict[str, Any]]]) -> None:
    statuses = [status for status, _ in answers]
    assert statuses == [202, 200, 202, 422], answers
    first, retried = answers[0][1], answers[1][1]
    assert retried == {"entry_id": first["entry_id"], "duplicate": True}


async def test_flask_app_publishes_synchronously(streamworks_redis_url: str) -> None:
    from examples.webapps.flask_app import create_app

    events.welcomed.clear()
    consumer = events.build_app()
    async with TestRuntime(consumer, workers=1, http=True, redis_url=streamworks_redis_url) as rt:
        producer = producer_for(rt)

        def serve_requests() -> list[tuple[int, dict[str, Any]]]:
            # What the web process does: one connect_sync() for its whole life, and
            # publish_sync() in the views, from the WSGI server's threads.
            with producer.connect_sync():
                client = create_app(producer).test_client()
                replies = [client.post("/signups", json=b, headers=h) for b, h in SIGNUPS]
                return [(r.status_code, r.get_json()) for r in replies]

        check_answers(await anyio.to_thread.run_sync(serve_requests))
        await rt.wait_idle(timeout=10)
        assert sorted(events.welcomed) == ["ada@example.org", "alan@example.org"]

        # The same view inside a runtime (a worker, a TestRuntime): publish_sync from
        # another thread is handed to the runtime's event loop.
        client = create_app(consumer).test_client()
        reply = await anyio.to_thread.run_sync(
            lambda: client.post("/signups", json={"email": "grace@example.org", "name": "G"})
        )
        assert reply.status_code == 202
        await rt.wait_idle(timeout=10)
        assert sorted(events.welcomed) == [
            "ada@example.org",
            "alan@example.org",
            "grace@example.org",
        ]


class _Server(uvicorn.Server):
    """uvicorn, leaving the test process's signal handlers alone."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def test_fastapi_app_publishes_asynchronously(streamworks_redis_url: str) -> None:
    from examples.webapps.fastapi_app import create_app

    events.welcomed.clear()
    consumer = events.build_app()
    async with TestRuntime(consumer, workers=1, http=True, redis_url=streamworks_redis_url) as rt:
        # Served by uvicorn over real HTTP, as in production: the lifespan opens the
        # connection (app.connect()) on the server's loop, the views await publish().
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        config = uvicorn.Config(
            create_app(producer_for(rt)), host="127.0.0.1", port=port, log_level="warning"
        )
        server = _Server(config)
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.serve)
            try:
                await wait_for(lambda: server.started, 10, "uvicorn to start")
                async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
                    replies = [await http.post("/signups", json=b, headers=h) for b, h in SIGNUPS]
            finally:
                server.should_exit = True
        answers = [(r.status_code, r.json()) for r in replies]
        assert answers[3][1]["detail"][0]["loc"] == ["body", "email"]
        check_answers(answers)
        await rt.wait_idle(timeout=10)
        assert sorted(events.welcomed) == ["ada@example.org", "alan@example.org"]


async def test_batch_writer_stores_every_valid_reading_and_dead_letters_the_rest(
    redis_env: str, tmp_path: Path
) -> None:
    from examples.batch_writer import app as batch_writer

    rows, dead = await batch_writer.main(tmp_path / "readings.db", count=2_000)
    assert (rows, dead) == (1_980, 20)
