"""Handlers that raise what ends a process: ``KeyboardInterrupt``, ``SystemExit``,
``GeneratorExit``, an application's own ``BaseException`` subclass, a sync handler's
thread exiting (``_thread.exit()``, which ends a plain thread silently).

They run in a real ``streamworks worker`` child process (in-process they would take the
test's own event loop down) against the test's coordinator, served over HTTP with a
token. What a demanding user expects, whichever way the worker copes:

* it does not die silently: it either treats the exception as a failed attempt (the
  message ends in the dead letters, the worker goes on), or it exits with a non-zero
  status and names the exception in its output, so a supervisor restarts it;
* the message is not lost: when the worker died it is still pending, and the healthy
  worker that takes the shard over handles it; messages published afterwards too.

(A ``CancelledError`` raised by a handler is in ``test_handlers.py``: it does not end
the process.)
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import SecretStr

from streamworks.testing import TestRuntime
from streamworks.testing.runtime import fast_settings
from tests.badinput import fatal_app
from tests.badinput.support import child_env, pending_count, spawn, stop, wait_exit
from tests.support import wait_for

TOKEN = "badinput-fatal-3f9a17c2"


KINDS = [
    (fatal_app.ASYNC_STREAM, "KeyboardInterrupt", "KeyboardInterrupt"),
    (fatal_app.ASYNC_STREAM, "SystemExit(0)", "SystemExit"),
    (fatal_app.ASYNC_STREAM, "SystemExit(3)", "SystemExit"),
    (fatal_app.ASYNC_STREAM, "FatalError", "FatalError"),
    (fatal_app.ASYNC_STREAM, "GeneratorExit", "GeneratorExit"),
    (fatal_app.SYNC_STREAM, "KeyboardInterrupt", "KeyboardInterrupt"),
    (fatal_app.SYNC_STREAM, "thread exit", "SystemExit"),
    (fatal_app.SYNC_STREAM, "FatalError", "FatalError"),
]


def _worker(rt: TestRuntime, log: Path) -> object:
    assert rt.http_url is not None
    env = child_env(
        {
            "BADINPUT_FATAL": "1",
            "STREAMWORKS_REDIS_URL": rt.settings.redis_url,
            "STREAMWORKS_KEY_PREFIX": rt.settings.key_prefix,
            "STREAMWORKS_COORDINATOR_URLS": rt.http_url,
            "STREAMWORKS_TOKEN": TOKEN,
            "STREAMWORKS_HEARTBEAT_INTERVAL": "0.1",
            "STREAMWORKS_LEASE_TTL": "2",
            "STREAMWORKS_WORKER__BLOCK": "0.5",
            "STREAMWORKS_WORKER__SHUTDOWN_TIMEOUT": "5",
            "STREAMWORKS_WORKER__HTTP_PORT": "0",  # tests run side by side: any free port
        }
    )
    return spawn(["-m", "streamworks", "worker", "tests.badinput.fatal_app:app"], env, log)


@pytest.mark.parametrize(("stream", "kind", "named"), KINDS)
async def test_a_handler_raising_a_base_exception_loses_nothing_and_is_not_silent(
    stream: str, kind: str, named: str, streamworks_redis_url: str, tmp_path: Path
) -> None:
    fatal_app.handled.clear()
    settings = fast_settings(token=SecretStr(TOKEN))
    async with TestRuntime(
        fatal_app.app, workers=0, http=True, redis_url=streamworks_redis_url, settings=settings
    ) as rt:
        service = rt.service
        assert service is not None
        log = tmp_path / "worker.log"
        proc = _worker(rt, log)
        try:

            async def joined() -> bool:
                try:
                    info = await service.group_info(fatal_app.GROUP)
                except Exception:
                    return False
                return info.state == "STABLE" and any(len(m.assigned) == 2 for m in info.members)

            await wait_for(joined, timeout=20, message="the worker process to join")
            await fatal_app.app.publish(stream, {"id": "fatal", "raise": kind})

            async def exited_or_dead_lettered() -> bool:
                return proc.poll() is not None or bool(await rt.dead_letters(stream))

            await wait_for(exited_or_dead_lettered, timeout=15, message="the worker to react")
            if proc.poll() is None:
                # It took the exception for a failed attempt: the message was
                # dead-lettered (naming it) and the worker keeps serving.
                [dead] = await rt.dead_letters(stream)
                assert named in dead.error, dead
                await fatal_app.app.publish(stream, {"id": "after"})
                await rt.wait_idle()
                return
            code = await wait_exit(proc, timeout=1)
        finally:
            stop(proc)
        output = log.read_text(errors="replace")
        assert named in output, output[-3000:]  # the exception is named in the output
        # Not lost: still pending, and the next owner handles it.
        assert await pending_count(rt, stream, fatal_app.GROUP) == 1
        await rt.advance(5)  # the dead member's lease runs out
        await rt.add_worker()
        await fatal_app.app.publish(stream, {"id": "after"})
        await rt.wait_idle()
        assert sorted(i for s, i, _ in fatal_app.handled if s == stream) == ["after", "fatal"]
        assert await rt.dead_letters(stream) == []
        assert code != 0, f"exit status {code}: {output[-2000:]}"  # not silent
