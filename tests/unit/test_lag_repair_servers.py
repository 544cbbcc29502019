"""Which servers the ACTIVE lag repair runs on (``coordinator/lag_repair.py``): those
that lose a consumer group's ``entries-read`` on an AOF reload or in replication
(redis/redis#12898, first in Redis 7.4; Valkey forked after it)."""

from __future__ import annotations

import pytest

from streamworks.coordinator.lag_repair import loses_entries_read


@pytest.mark.parametrize(
    ("server", "version", "loses"),
    [
        ("redis", "7.0.15", True),
        ("redis", "7.2.6", True),
        ("redis", "7.4.0", False),
        ("redis", "8.2.1", False),
        ("valkey", "7.2.5", True),
        ("valkey", "8.0.1", False),
        ("valkey", "8.1.8", False),
        ("keydb", "6.3.4", True),  # a server this cannot tell: repaired (never harms)
        ("redis", "unstable", True),
    ],
)
def test_servers_that_lose_entries_read(server: str, version: str, loses: bool) -> None:
    assert loses_entries_read(server, version) is loses
