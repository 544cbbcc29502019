"""``streamworks dev --reload``: a code change restarts the app; the Redis, the key
prefix and the coordinator URL stay, and so do the streams created before."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

from streamworks.protocol.client import CoordinatorClient
from tests.e2e.harness import REPO, Cluster, Proc, free_port, spawn, wait_until

APP = """
from streamworks import App

app = App("reloading")
app.stream("notes", shards=2)


@app.handler("notes")
async def handle(note: dict) -> None:
    pass
"""


def starts(dev: Proc) -> list[str]:
    """The Redis URL of every start of the app so far."""
    return re.findall(r"Redis: (redis://\S+)", dev.output())


async def test_reload_restarts_the_app_and_keeps_redis_and_url(
    cluster: Cluster, tmp_path: Path
) -> None:
    (tmp_path / "devapp.py").write_text(APP)
    port = free_port()
    env = {**cluster.env(), "PYTHONPATH": f"{tmp_path}:{REPO}"}
    args = ["-m", "streamworks", "dev", "devapp:app", "--workers", "1", "--port", str(port)]
    # Run from the app's directory, as a user would: the watch covers it alone, not the
    # repository with its virtualenv.
    dev = spawn("dev", [*args, "--reload"], env, tmp_path, cwd=tmp_path)
    cluster.procs.append(dev)

    async def started(n: int) -> bool:
        if not dev.alive():
            raise AssertionError(f"dev exited:\n{dev.output()}")
        return len(starts(dev)) >= n

    try:
        await wait_until(lambda: started(1), 30, "dev to start", 0.1)
        async with CoordinatorClient([f"http://127.0.0.1:{port}"]) as client:
            await wait_until(lambda: _members(client, 1), 20, "one member")
            await client.create_stream("kept", 1)
            (tmp_path / "devapp.py").write_text(APP + "\n# changed\n")
            await wait_until(lambda: started(2), 30, "the restart after the change", 0.1)
            assert "restarting the app" in dev.output()
            first, second = starts(dev)[:2]
            assert first == second  # the same Redis
            await wait_until(lambda: _members(client, 1), 20, "the restarted member")
            assert "kept" in {s.name for s in await client.streams()}
        dev.send(signal.SIGINT)
        assert await dev.wait_exit(20) == 0, dev.output()[-2000:]
    finally:
        if dev.alive():
            os.killpg(dev.pid, signal.SIGKILL)  # the supervisor and its app process


async def _members(client: CoordinatorClient, n: int) -> bool:
    group = await client.group("reloading")
    live = [m for m in group.members if m.state not in ("EXPIRED", "FENCED")]
    return group.state == "STABLE" and len(live) == n
