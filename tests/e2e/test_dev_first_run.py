"""``streamworks dev`` for a first run (issue 22, item 6): INFO by default with a line
per handled message, ``--redis`` to reuse a server (its data stays), and the
``streamworks publish ... --redis URL`` line a user needs printed and working.

(Before: WARNING by default and nothing while handlers succeeded, a new random Redis
port each run, no ``--redis``, and no publish line.)"""

from __future__ import annotations

import re
import shlex
import signal
from typing import Any

import orjson

from streamworks.redis.keyspace import Keyspace
from tests.e2e.harness import Cluster, wait_until
from tests.e2e.test_cli import text

ORDER = {"id": "o-1", "customer": "c-7", "amount": 42}


async def test_dev_shows_each_message_and_talks_to_a_reused_redis(
    cluster: Cluster, redis: Any
) -> None:
    # No --port: 7400, or a free port (logged) when something here holds 7400.
    dev = cluster.start(
        "dev", "dev", "examples.orders.app:app", "--workers", "1",
        "--redis", cluster.redis_url, "--key-prefix", cluster.prefix,
        env={"COLUMNS": "400"},
    )  # fmt: skip

    async def printed() -> tuple[str, str] | None:
        if not dev.alive():
            raise AssertionError(f"dev exited ({dev.popen.poll()}):\n{dev.output()}")
        url = re.search(r"coordinator: (http://\S+)\s+Redis: (\S+)", dev.output())
        line = re.search(r"^\s+(streamworks publish .*)$", dev.output(), re.M)
        return (url[1], line[1]) if url and line and url[2] == cluster.redis_url else None

    url, publish = await wait_until(printed, 60, "dev to print its URLs", 0.1)
    if not url.endswith(":7400"):
        assert "port 7400 is taken" in dev.output(), dev.output()
    words = shlex.split(publish)
    assert words[:3] == ["streamworks", "publish", "orders"], words
    assert words[words.index("--redis") + 1] == cluster.redis_url
    assert words[words.index("--key-prefix") + 1] == cluster.prefix
    assert words[words.index("--coordinator") + 1] == url

    # The printed line, with a value of the user's, publishes to this dev.
    words[3] = orjson.dumps(ORDER).decode()
    sent = await cluster.cli(*words[1:], "--key", "c-7")
    assert sent.returncode == 0, text(sent)

    async def handled() -> bool:
        return bool(re.search(r"INFO +streamworks\.dev: handled orders/\d+@0 ", dev.output()))

    await wait_until(handled, 30, "a line for the handled message", 0.1)

    dev.send(signal.SIGINT)
    assert await dev.wait_exit(30) == 0, dev.output()[-3000:]
    # --redis: the server is the user's, and keeps the data for the next run.
    keys = [k async for k in redis.scan_iter(match=Keyspace(cluster.prefix).registry_streams())]
    assert keys and await redis.sismember(Keyspace(cluster.prefix).registry_streams(), "orders")
