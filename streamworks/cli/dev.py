"""``streamworks dev MODULE:APP`` — everything in one process, for a first run."""

from __future__ import annotations

import errno
import functools
import logging
import os
import signal
import socket
import subprocess
import sys
from typing import Any

import anyio
import click

from streamworks.app import App
from streamworks.cli.common import (
    EXIT_USAGE,
    check_redis_url,
    configure_logging,
    fail,
    load_app,
    logging_options,
    make_settings,
    plural,
    run_async,
)
from streamworks.cli.coordinator import bind_listener
from streamworks.cli.output import make_console
from streamworks.cli.render import status_view
from streamworks.clock import Clock
from streamworks.coordinator.http import QuietServer, create_api, server_config
from streamworks.middleware import HandleNext, Middleware
from streamworks.runtime.message import Context
from streamworks.settings import Settings
from streamworks.testing.embedded import EmbeddedRedis
from streamworks.testing.runtime import TestRuntime

console = make_console()
log = logging.getLogger("streamworks.cli")
#: The compact line per handler run (INFO).
trace = logging.getLogger("streamworks.dev")

#: Where dev's coordinator listens when --port is not given (a free port when taken).
DEFAULT_PORT = 7400


class HandledLines(Middleware):
    """One compact log line per handler run: what ``dev`` shows while handlers succeed
    (a worker logs failures, retries and dead letters itself)."""

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock = clock or Clock()

    async def handle(self, ctx: Context, call_next: HandleNext) -> None:
        message = ctx.message
        key = f" key={message.key}" if message.key is not None else ""
        attempt = f" attempt {message.attempt}" if message.attempt > 1 else ""
        started = self.clock.monotonic()
        try:
            await call_next(ctx)
        except Exception as e:
            took = (self.clock.monotonic() - started) * 1000
            trace.info(
                "failed  %s %s%s%s in %.1f ms: %s: %s",
                message.shard, message.id, key, attempt, took, type(e).__name__, e,
            )  # fmt: skip
            raise
        took = (self.clock.monotonic() - started) * 1000
        trace.info("handled %s %s%s%s in %.1f ms", message.shard, message.id, key, attempt, took)


@click.command()
@click.argument("target", metavar="MODULE:APP")
@click.option("--workers", type=click.IntRange(0, 64), default=2, show_default=True)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    help=f"the coordinator's port on 127.0.0.1 [default: {DEFAULT_PORT}, or a free port when "
    "it is taken; 0: any free port]",
)
@click.option("--key-prefix", help="key namespace [env STREAMWORKS_KEY_PREFIX; default sw]")
@click.option(
    "--redis",
    "use_redis",
    help="use this Redis (its data stays) instead of a private embedded one, discarded on exit",
)
@click.option(
    "--reload",
    is_flag=True,
    help="restart the app when a .py file under the cwd or the app's directory changes",
)
@click.option("--quiet", is_flag=True, help="no line per handled message")
@logging_options("INFO")
def dev(
    target: str,
    workers: int,
    port: int | None,
    key_prefix: str | None,
    use_redis: str | None,
    reload: bool,
    quiet: bool,
    log_level: str,
    log_format: str,
    **_: Any,
) -> None:
    """Embedded Redis + a coordinator (HTTP) + N workers of the app, in one process.

    Logs a line per handled message (--quiet: none). Prints the coordinator URL, the
    Redis URL and the key prefix, with the commands to publish to it, look at it and
    its dead letters from another terminal. --redis reuses a server (and its data)
    across runs. With --reload, the app restarts on code changes; Redis (with its
    streams, groups and messages) and the coordinator's URL stay. Ctrl-C stops
    everything; an embedded Redis is discarded.
    """
    configure_logging(log_level, log_format)
    settings = make_settings(**({"key_prefix": key_prefix} if key_prefix else {}))
    if use_redis is not None:
        check_redis_url(use_redis)
    app = None if reload else load_app(target)  # a broken app fails before Redis starts
    server: EmbeddedRedis | None = None
    if use_redis is not None:
        redis_url = use_redis  # the user's (or --reload's supervisor's) server
    else:
        # Always a private server: never a Redis named by the environment (such as
        # STREAMWORKS_TEST_REDIS_URL, which TestRuntime would otherwise pick up).
        try:
            server = EmbeddedRedis().start()
        except FileNotFoundError as e:
            fail(str(e))  # what to install, in one line
        except (OSError, RuntimeError) as e:
            fail(f"cannot start an embedded Redis: {e}")
        redis_url = server.url
    try:
        if app is None:
            options = ["--log-level", log_level, "--log-format", log_format]
            options += ["--quiet"] if quiet else []
            _supervise(target, workers, port, settings.key_prefix, redis_url, options)
            return
        if not quiet:
            app.middleware = (*app.middleware, HandledLines())
        console.print(
            f"starting {'an embedded Redis, ' if server else ''}a coordinator and "
            f"{plural(workers, 'worker')} of {app.name!r}",
            highlight=False,
        )
        run_async(_run)(app, workers, port, settings.with_overrides(redis_url=redis_url))
    finally:
        if server is not None:
            server.stop()


def _supervise(
    target: str,
    workers: int,
    port: int | None,
    prefix: str,
    redis_url: str,
    options: list[str],
) -> None:
    """Run ``dev`` without --reload in a child process, restarted on code changes."""
    try:
        import watchfiles
    except ImportError:
        fail("--reload needs watchfiles: pip install 'streamworks[embedded]'")

    if port == 0:
        fail("--reload needs a fixed --port (the URL must survive restarts)", EXIT_USAGE)
    if port is None:
        # The URL must survive restarts: choose the port once, here.
        port = _listener(None).getsockname()[1]
    command = [
        sys.executable, "-m", "streamworks", "dev", target,
        "--workers", str(workers), "--port", str(port), "--key-prefix", prefix,
        "--redis", redis_url, *options,
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


def _listener(port: int | None) -> socket.socket:
    """The coordinator's socket: ``port``, or when none was chosen 7400, or a free
    port when 7400 is taken (a coordinator or another dev already runs here)."""
    try:
        return bind_listener("127.0.0.1", DEFAULT_PORT if port is None else port)
    except OSError as e:
        if port is not None or e.errno != errno.EADDRINUSE:
            fail(
                f"cannot listen on 127.0.0.1:{port}: {e.strerror or e} (choose another --port)",
                EXIT_USAGE,
            )
    sock = bind_listener("127.0.0.1", 0)
    log.warning(
        "port %d is taken (a coordinator or another dev runs here?): the coordinator "
        "listens on %d instead (--port chooses one)",
        DEFAULT_PORT,
        sock.getsockname()[1],
    )
    return sock


def _next_steps(app: App, url: str, settings: Settings) -> list[str]:
    """The commands a user runs from another terminal to talk to this dev."""
    redis = f"--redis {settings.redis_url} --key-prefix {settings.key_prefix}"
    stream = next(iter(app.handlers), None) or next(iter(app.streams), "STREAM")
    return [
        f"  streamworks publish {stream} '<JSON value>' --coordinator {url} {redis}",
        f"  streamworks status --coordinator {url}",
        f"  streamworks dlq ls {redis}",
        f"  dashboard: {url}/ui/",
    ]


async def _run(app: App, workers: int, port: int | None, settings: Settings) -> None:
    sock = _listener(port)
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
            for line in _next_steps(app, url, settings):
                console.print(line, highlight=False, markup=False, soft_wrap=True)
            console.print(status_view(await rt.service.status()))
            console.print("running; Ctrl-C to stop")
            with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for _ in signals:
                    console.print("stopping ...")
                    break
            server.should_exit = True
