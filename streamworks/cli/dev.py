"""``streamworks dev MODULE:APP`` — everything in one process, for a first run."""

from __future__ import annotations

import functools
import logging
import os
import signal
import subprocess
import sys
from typing import Any

import anyio
import click

from streamworks.app import App
from streamworks.cli.common import (
    check_redis_url,
    configure_logging,
    fail,
    load_app,
    logging_options,
    make_settings,
    run_async,
)
from streamworks.cli.coordinator import bind_listener
from streamworks.cli.output import make_console
from streamworks.cli.render import status_view
from streamworks.coordinator.http import QuietServer, create_api, server_config
from streamworks.settings import Settings
from streamworks.testing.embedded import EmbeddedRedis
from streamworks.testing.runtime import TestRuntime

console = make_console()
log = logging.getLogger("streamworks.cli")

#: Where dev's coordinator listens when --port is not given.
DEFAULT_PORT = 7400


@click.command()
@click.argument("target", metavar="MODULE:APP")
@click.option("--workers", type=click.IntRange(0, 64), default=2, show_default=True)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=DEFAULT_PORT,
    show_default=True,
    help="the coordinator's port on 127.0.0.1 (0: any free port)",
)
@click.option("--key-prefix", help="key namespace [env STREAMWORKS_KEY_PREFIX; default sw]")
@click.option(
    "--reload",
    is_flag=True,
    help="restart the app when a .py file under the cwd or the app's directory changes",
)
@click.option("--redis-url", "use_redis", hidden=True)  # --reload hands its Redis down
@logging_options("WARNING")
def dev(
    target: str,
    workers: int,
    port: int,
    key_prefix: str | None,
    reload: bool,
    use_redis: str | None,
    log_level: str,
    log_format: str,
    **_: Any,
) -> None:
    """Embedded Redis + a coordinator (HTTP) + N workers of the app, in one process.

    The coordinator URL, Redis URL and key prefix are printed, so `streamworks status
    --coordinator URL` and `streamworks dlq ls --redis URL` work from another terminal.
    With --reload, the app restarts on code changes; Redis (with its streams, groups
    and messages) and the coordinator's URL stay. Ctrl-C stops everything; the embedded
    Redis is discarded.
    """
    configure_logging(log_level, log_format)
    settings = make_settings(**({"key_prefix": key_prefix} if key_prefix else {}))
    if use_redis is not None:
        check_redis_url(use_redis)
    app = None if reload else load_app(target)  # a broken app fails before Redis starts
    server: EmbeddedRedis | None = None
    if use_redis is not None:
        redis_url = use_redis  # --reload's supervisor started it
    else:
        # Always a private server: never a Redis named by the environment (such as
        # STREAMWORKS_TEST_REDIS_URL, which TestRuntime would otherwise pick up).
        try:
            server = EmbeddedRedis().start()
        except (OSError, RuntimeError) as e:
            fail(f"cannot start an embedded Redis: {e}")
            raise  # unreachable
        redis_url = server.url
    try:
        if app is None:
            _supervise(target, workers, port, settings.key_prefix, redis_url, log_level, log_format)
            return
        console.print(
            f"starting {'an embedded Redis, ' if server else ''}a coordinator and {workers} "
            f"workers of {app.name!r}"
        )
        run_async(_run)(app, workers, port, settings.with_overrides(redis_url=redis_url))
    finally:
        if server is not None:
            server.stop()


def _supervise(
    target: str,
    workers: int,
    port: int,
    prefix: str,
    redis_url: str,
    log_level: str,
    log_format: str,
) -> None:
    """Run ``dev`` without --reload in a child process, restarted on code changes."""
    import watchfiles

    if port == 0:
        fail("--reload needs a fixed --port (the URL must survive restarts)", 2)
    command = [
        sys.executable, "-m", "streamworks", "dev", target,
        "--workers", str(workers), "--port", str(port), "--key-prefix", prefix,
        "--redis-url", redis_url, "--log-level", log_level, "--log-format", log_format,
    ]  # fmt: skip
    paths = sorted({os.getcwd(), *_module_dir(target)})
    console.print(f"watching {', '.join(paths)} for changes to .py files (Ctrl-C stops)")
    # The watch is set up before the app starts (watchfiles.run_process starts the
    # process first and watches after, so a change made while a large tree, such as a
    # virtualenv under the working directory, was still being walked went unseen).
    # The first value is yielded once the watches exist: an empty set after the short
    # timeout, or changes already.
    changes_seen = watchfiles.watch(
        *paths,
        watch_filter=watchfiles.PythonFilter(),
        yield_on_timeout=True,
        rust_timeout=_WATCH_TICK_MS,
        raise_interrupt=False,
    )
    previous = signal.signal(signal.SIGTERM, _interrupt)  # stop like Ctrl-C does
    child: subprocess.Popen[bytes] | None = None
    try:
        next(changes_seen, None)
        child = subprocess.Popen(command)
        for changes in changes_seen:
            if not changes:
                continue
            names = sorted({os.path.relpath(path) for _, path in changes})
            console.print(f"[yellow]changed: {', '.join(names)}; restarting the app[/]")
            _stop(child)
            child = subprocess.Popen(command)
    except KeyboardInterrupt:
        pass  # a Ctrl-C while the app (re)starts
    finally:
        signal.signal(signal.SIGTERM, previous)
        if child is not None:
            _stop(child)


#: How often the reload watch looks up from waiting (ms): the first look, made once
#: the watches exist, lets the app start.
_WATCH_TICK_MS = 200
#: How long the app has to stop on SIGINT before it is killed (seconds).
_STOP_TIMEOUT = 10.0


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _stop(child: subprocess.Popen[bytes]) -> None:
    """Stop the app like Ctrl-C does (SIGINT), killing it if it does not exit in time."""
    if child.poll() is not None:
        return
    child.send_signal(signal.SIGINT)
    try:
        child.wait(_STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


def _module_dir(target: str) -> list[str]:
    """The directory of the app's module (found without importing it), if any."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(target.partition(":")[0])
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.origin or not os.path.exists(spec.origin):
        return []
    return [os.path.dirname(os.path.abspath(spec.origin))]


async def _run(app: App, workers: int, port: int, settings: Settings) -> None:
    try:
        sock = bind_listener("127.0.0.1", port)
    except OSError as e:
        fail(f"cannot listen on 127.0.0.1:{port}: {e.strerror or e} (choose another --port)", 2)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    async with TestRuntime(
        app,
        workers=workers,
        settings=settings,
        redis_url=settings.redis_url,
        key_prefix=settings.key_prefix,
    ) as rt:
        assert rt.service is not None
        config = server_config(create_api(rt.service), settings)
        server = QuietServer(config)
        async with anyio.create_task_group() as tg:
            tg.start_soon(functools.partial(server.serve, sockets=[sock]))
            with anyio.fail_after(10):
                while not server.started and not server.should_exit:  # noqa: ASYNC110
                    await anyio.sleep(0.01)  # uvicorn exposes no started event
            console.print(
                f"coordinator: [b]{url}[/b]  Redis: [b]{settings.redis_url}[/b]  "
                f"key prefix: [b]{settings.key_prefix}[/b]",
                highlight=False,
            )
            console.print(f"  streamworks status --coordinator {url}", highlight=False)
            console.print(
                f"  streamworks dlq ls --redis {settings.redis_url} "
                f"--key-prefix {settings.key_prefix}",
                highlight=False,
            )
            console.print(status_view(await rt.service.status()))
            console.print("running; Ctrl-C to stop")
            with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for _ in signals:
                    console.print("stopping ...")
                    break
            server.should_exit = True
