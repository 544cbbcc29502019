"""Handler failures that used to take a worker down, run in a child process.

``python -m tests.badinput.crash_scenarios REDIS_URL NAME...`` runs each named scenario
in a ``TestRuntime`` of its own (a real coordinator and worker on that Redis) and
prints one JSON line per scenario: whether the runtime survived, what it raised, the
dead letters and what was handled. A crashed runtime can leave its event loop in a
state no test process should share (``TestRuntime`` then raises a bare
``CancelledError`` and leaks its task group), and some scenarios hang for good, hence
the child process, and a watchdog that reports a scenario as hung and exits.

In every scenario the handler misbehaves on the message ``{"id": "bad"}`` only, and
``{"id": "good"}`` is published after it.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

import anyio

from streamworks import App, Retry, RetryPolicy
from streamworks.testing import TestRuntime


class UnprintableError(Exception):
    def __str__(self) -> str:
        raise RuntimeError("__str__ failed")


class NonStrError(Exception):
    def __str__(self) -> Any:
        return 42


def _fail(name: str) -> None:
    if name == "plain ValueError":  # the control: this one works
        raise ValueError("plain")
    if name == "surrogate in the exception message":
        # os.fsdecode() of a file name that is not UTF-8 gives such strings
        path = os.fsdecode(b"/data/caf\xe9.csv")
        raise ValueError(f"cannot parse {path}")
    if name == "exception whose __str__ raises":
        raise UnprintableError
    if name == "exception whose __str__ returns a non-string":
        raise NonStrError
    if name == "Retry(delay=inf)":
        raise Retry(delay=float("inf"))
    if name == "Retry(reason=None)":
        raise Retry(delay=0, reason=None)  # type: ignore[arg-type]
    raise AssertionError(name)


SCENARIOS = [
    "plain ValueError",
    "surrogate in the exception message",
    "exception whose __str__ raises",
    "exception whose __str__ returns a non-string",
    "Retry(delay=inf)",
    "Retry(reason=None)",
    "publish_sync in a sync handler",
]


def build(name: str) -> tuple[App, list[str]]:
    app = App("badinput-crash")
    app.stream("s", shards=1)
    app.stream("out", shards=1)
    handled: list[str] = []
    policy = RetryPolicy(max_attempts=2, backoff=0.001)
    handler: Callable[..., Any]
    if name == "publish_sync in a sync handler":

        def handler(value: dict[str, str]) -> None:
            # A sync handler cannot await ctx.publish; the documented blocking
            # variant is app.publish_sync.
            for i in range(10):
                app.publish_sync("out", {"from": value["id"], "i": i})
            handled.append(value["id"])

    else:

        async def handler(value: dict[str, str]) -> None:
            if value["id"] == "bad":
                _fail(name)
            handled.append(value["id"])

    app.handler("s", retry=policy)(handler)

    @app.handler("out")
    async def on_out(value: dict[str, Any]) -> None:
        handled.append(f"out:{value['from']}:{value['i']}")

    return app, handled


async def run(redis_url: str, name: str) -> dict[str, Any]:
    app, handled = build(name)
    result: dict[str, Any] = {"name": name, "survived": False, "raised": None, "idle": False}
    try:
        async with TestRuntime(app, redis_url=redis_url) as rt:
            await app.publish("s", {"id": "bad"})
            await app.publish("s", {"id": "good"})
            try:
                await rt.wait_idle(timeout=5)
                result["idle"] = True
            except TimeoutError as e:
                result["raised"] = f"TimeoutError: {e}"
            result["dead"] = [[d.reason, d.attempts, d.error] for d in await rt.dead_letters("s")]
            result["statistics"] = rt.statistics("s")
        result["survived"] = True
    except BaseException as e:  # the crash is what is observed
        result["raised"] = f"{type(e).__name__}: {e}"[:500]
    result["handled"] = handled
    return result


#: A scenario still running after this long has hung (its handler or the whole event
#: loop is stuck): a watchdog thread reports it and ends the process.
HANG_AFTER = 10.0


def _hung(name: str) -> None:
    result = {"name": name, "survived": False, "idle": False, "handled": []}
    result["raised"] = f"hung: still running after {HANG_AFTER} s"
    print(json.dumps(result), flush=True)
    os._exit(3)


def main() -> None:
    redis_url, *names = sys.argv[1:]
    for name in names or SCENARIOS:
        watchdog = threading.Timer(HANG_AFTER, _hung, [name])
        watchdog.daemon = True
        watchdog.start()
        result = anyio.run(run, redis_url, name)
        watchdog.cancel()
        print(json.dumps(result), flush=True)
    # A crashed scenario can leave a thread behind that never ends (publish_sync's
    # blocking portal): do not wait for it at interpreter exit.
    os._exit(0)


if __name__ == "__main__":
    main()
