"""Where test servers come from: embedded binary, or Docker when one is reachable."""

from __future__ import annotations

import pytest
import redis as redis_sync

from streamworks.testing.containers import docker_available, redis_container
from streamworks.testing.embedded import EmbeddedRedis, find_server_binary


def test_embedded_server_starts_answers_and_stops() -> None:
    server = EmbeddedRedis().start()
    try:
        client = redis_sync.Redis.from_url(server.url)
        assert client.ping()
        client.close()
    finally:
        server.stop()
    assert server.pid is None
    assert find_server_binary()


def test_embedded_server_with_aof_keeps_data_across_a_kill() -> None:
    with EmbeddedRedis(appendonly=True) as server:
        client = redis_sync.Redis.from_url(server.url)
        client.xadd("s", {"v": "1"})
        client.close()
        server.restart()  # SIGKILL, then start again on the same port and directory
        client = redis_sync.Redis.from_url(server.url)
        assert client.xlen("s") == 1
        client.close()


@pytest.mark.skipif(not docker_available(), reason="no Docker engine answers here")
def test_testcontainers_redis() -> None:
    with redis_container() as url:
        client = redis_sync.Redis.from_url(url)
        assert client.ping()
        client.close()
