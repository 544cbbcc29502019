"""``streamworks worker --processes N``: N worker processes under one supervisor.

The supervisor is the parent process. It starts each child as a fresh interpreter
(``python -m streamworks worker MODULE:APP ...``, never a fork: a forked event loop,
Redis connections or threads would be shared by accident), so every child is an
ordinary worker and a member of its own (its own member id, its own shards).

What the supervisor does, and nothing more:

* **Restart** a child that exits without being asked to, after a delay that doubles
  with each consecutive crash of that child (``supervisor.restart_delay`` up to
  ``supervisor.restart_delay_max``); a child that ran longer than
  ``supervisor.crash_window`` starts again from the first delay.
* **Give up** when more than ``supervisor.max_crashes`` crashes (of all children)
  fall within ``supervisor.crash_window`` seconds: it stops the others gracefully
  and exits 1 with one error line. A child that cannot start (bad Redis URL, a
  coordinator refusing it) hits this limit within seconds instead of looping.
* **Forward** SIGTERM/SIGINT to every child as SIGTERM and wait for their graceful
  exit (in-flight work finishes, acks flush, each leaves the group), at most
  ``supervisor.stop_timeout`` seconds, then SIGKILL. A second signal SIGKILLs the
  children at once and exits 2 (their unfinished work stays pending for the next
  owner, as with a single worker).

Children run in a process group of their own, so a terminal's Ctrl-C reaches only
the supervisor (which forwards one SIGTERM) instead of every child twice. On Linux
each child also gets ``PR_SET_PDEATHSIG``: if the supervisor itself is SIGKILLed,
its children receive SIGTERM and leave gracefully instead of lingering as orphans.

The loop runs without an event loop: signals (SIGCHLD included) arrive through
``signal.set_wakeup_fd`` on a self-pipe; the only timeouts are the next restart
deadline and the stop timeout.
"""

from __future__ import annotations

import collections
import logging
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import click

from streamworks.settings import Settings, SupervisorSettings

__all__ = (
    "ChildProcess",
    "CrashBudget",
    "Supervisor",
    "child_commands",
    "child_environments",
    "restart_delay",
    "supervise_workers",
)

log = logging.getLogger("streamworks.supervisor")

#: The signals the supervisor forwards (as SIGTERM) to its children.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def restart_delay(settings: SupervisorSettings, consecutive: int) -> float:
    """The wait before restarting a child after its ``consecutive``-th crash in a row."""
    if consecutive <= 0:
        return 0.0
    delay = settings.restart_delay * 2 ** (consecutive - 1)
    return float(min(delay, settings.restart_delay_max))


class CrashBudget:
    """Counts crashes in a sliding window: exhausted once more than ``max_crashes``
    fall within ``crash_window`` seconds of each other."""

    def __init__(self, settings: SupervisorSettings) -> None:
        self._settings = settings
        self._times: collections.deque[float] = collections.deque()

    def record(self, now: float) -> bool:
        """Count a crash at ``now``; True when the budget is exhausted."""
        self._times.append(now)
        while self._times and now - self._times[0] > self._settings.crash_window:
            self._times.popleft()
        return len(self._times) > self._settings.max_crashes

    @property
    def recent(self) -> int:
        """Crashes counted in the current window."""
        return len(self._times)


@dataclass
class ChildProcess:
    """One slot of the supervisor: the command of child ``index`` and its process."""

    index: int
    argv: list[str]
    env: dict[str, str]
    popen: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    consecutive_crashes: int = 0
    restart_at: float | None = None  # when a crashed child is due to start again
    exit_codes: list[int] = field(default_factory=list)

    @property
    def running(self) -> bool:
        return self.popen is not None and self.popen.returncode is None


def describe_exit(code: int) -> str:
    """``exit code 1`` or ``killed by SIGKILL`` (Popen's negative codes are signals)."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


class Supervisor:
    """Runs ``len(commands)`` children until told to stop or until they keep crashing.

    Args:
        commands: the argv of each child (index = position).
        envs: the environment of each child (same positions as ``commands``).
        settings: restart and give-up policy.
        clock: monotonic seconds.
    """

    def __init__(
        self,
        commands: Sequence[Sequence[str]],
        envs: Sequence[Mapping[str, str]],
        settings: SupervisorSettings,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.children = [
            ChildProcess(i, list(argv), dict(env))
            for i, (argv, env) in enumerate(zip(commands, envs, strict=True))
        ]
        self.settings = settings
        self.clock = clock
        self.budget = CrashBudget(settings)
        self.stopping = False
        self.gave_up: str | None = None  # the one-line reason, when it gave up
        self._signals_seen = 0
        self._killed = False  # a second signal: the children were SIGKILLed
        self._stop_codes: list[int] = []  # exit codes of the children asked to stop

    # -- entry point -------------------------------------------------------------------
    def run(self) -> int:
        """Supervise until stopped; the exit code for the supervisor process."""
        read_fd, write_fd = os.pipe()
        os.set_blocking(read_fd, False)
        os.set_blocking(write_fd, False)
        previous_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        watched = (*STOP_SIGNALS, signal.SIGCHLD)
        previous = {s: signal.signal(s, _note_signal) for s in watched}
        selector = selectors.DefaultSelector()
        selector.register(read_fd, selectors.EVENT_READ)
        try:
            for child in self.children:
                self._start(child)
            return self._loop(selector, read_fd)
        except BaseException:
            self._kill_all()  # never leave children behind on an unexpected error
            raise
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            signal.set_wakeup_fd(previous_fd)
            selector.close()
            os.close(read_fd)
            os.close(write_fd)

    # -- the loop ----------------------------------------------------------------------
    def _loop(self, selector: selectors.BaseSelector, read_fd: int) -> int:
        stop_deadline: float | None = None
        while True:
            for signum in self._wait(selector, read_fd, stop_deadline):
                if signum in STOP_SIGNALS:
                    self._on_stop_signal(signal.Signals(signum))
            self._reap()
            if self._killed:
                return 2
            now = self.clock()
            if self.stopping:
                if stop_deadline is None:
                    stop_deadline = now + self.settings.stop_timeout
                if not any(c.running for c in self.children):
                    return self._exit_code()
                if now >= stop_deadline:
                    log.warning(
                        "worker processes still running %.0fs after SIGTERM: killing them",
                        self.settings.stop_timeout,
                    )
                    self._kill_all()
                continue
            for child in self.children:
                if child.restart_at is not None and now >= child.restart_at:
                    self._start(child)

    def _wait(
        self, selector: selectors.BaseSelector, read_fd: int, stop_deadline: float | None
    ) -> list[int]:
        """Block until a signal arrives or the next deadline; the signals received."""
        deadlines = [c.restart_at for c in self.children if c.restart_at is not None]
        if stop_deadline is not None:
            deadlines.append(stop_deadline)
        timeout = max(0.0, min(deadlines) - self.clock()) if deadlines else None
        if not selector.select(timeout):
            return []
        try:
            return list(os.read(read_fd, 512))
        except BlockingIOError:
            return []

    def _reap(self) -> None:
        """Collect every child that exited; schedule its restart, or give up."""
        for child in self.children:
            if child.popen is None or child.popen.returncode is not None:
                continue
            code = child.popen.poll()
            if code is None:
                continue
            child.exit_codes.append(code)
            now = self.clock()
            ran = now - child.started_at
            pid = child.popen.pid
            if self.stopping:
                self._stop_codes.append(code)
                log.info(
                    "worker process %d (pid %d) exited: %s", child.index, pid, describe_exit(code)
                )
                continue
            if ran > self.settings.crash_window:
                child.consecutive_crashes = 0
            child.consecutive_crashes += 1
            if self.budget.record(now):
                self.gave_up = (
                    f"worker processes crashed {self.budget.recent} times within "
                    f"{self.settings.crash_window:g}s (more than supervisor.max_crashes="
                    f"{self.settings.max_crashes}); last: process {child.index} (pid {pid}) "
                    f"{describe_exit(code)} after {ran:.1f}s; giving up"
                )
                log.error(
                    "worker process %d (pid %d) exited: %s", child.index, pid, describe_exit(code)
                )
                self._stop_all()
                return
            delay = restart_delay(self.settings, child.consecutive_crashes)
            child.restart_at = now + delay
            log.warning(
                "worker process %d (pid %d) exited unexpectedly: %s after %.1fs; "
                "restarting in %.1fs",
                child.index,
                pid,
                describe_exit(code),
                ran,
                delay,
            )

    # -- actions -----------------------------------------------------------------------
    def _start(self, child: ChildProcess) -> None:
        child.restart_at = None
        child.popen = subprocess.Popen(
            child.argv,
            env=child.env,
            stdin=subprocess.DEVNULL,
            process_group=0,  # the terminal's Ctrl-C reaches the supervisor only
            preexec_fn=_die_with_parent(os.getpid()),
        )
        child.started_at = self.clock()
        log.info("worker process %d started (pid %d)", child.index, child.popen.pid)

    def _on_stop_signal(self, signum: signal.Signals) -> None:
        self._signals_seen += 1
        if self._signals_seen == 1 and not self.stopping:
            log.info(
                "%s: stopping %d worker processes gracefully; signal again to kill them",
                signum.name,
                sum(c.running for c in self.children),
            )
            self._stop_all()
        elif self._signals_seen > 1:
            log.warning("second signal: killing the worker processes; unfinished work stays")
            self._kill_all()
            self._killed = True

    def _stop_all(self) -> None:
        self.stopping = True
        for child in self.children:
            child.restart_at = None
            if child.running:
                assert child.popen is not None
                _send(child.popen, signal.SIGTERM)

    def _kill_all(self) -> None:
        running = [c for c in self.children if c.running]
        for child in running:
            assert child.popen is not None
            _send(child.popen, signal.SIGKILL)
        for child in running:
            assert child.popen is not None
            code = child.popen.wait()  # SIGKILL cannot be ignored: this returns
            child.exit_codes.append(code)
            self._stop_codes.append(code)
            log.info(
                "worker process %d (pid %d) exited: %s",
                child.index,
                child.popen.pid,
                describe_exit(code),
            )

    def _exit_code(self) -> int:
        if self.gave_up is not None:
            return 1
        # A stop asked for: 0 when every child that was running stopped cleanly.
        return 0 if all(code == 0 for code in self._stop_codes) else 1


def _note_signal(signum: int, frame: object) -> None:
    """The wakeup fd carries the signal number; the handler itself has nothing to do."""


def _send(popen: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    try:
        popen.send_signal(sig)
    except ProcessLookupError:  # it exited in between; the reaper collects it
        pass


def _die_with_parent(parent: int) -> Callable[[], None] | None:
    """A ``preexec_fn`` asking Linux to SIGTERM the child when the supervisor dies."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_pdeathsig = 1

    def preexec() -> None:
        libc.prctl(pr_set_pdeathsig, int(signal.SIGTERM))
        if os.getppid() != parent:  # the supervisor died before prctl took effect
            os._exit(1)

    return preexec


#: Worker settings of its HTTP endpoint (metrics, health) that each child gets from
#: the supervisor's effective settings, whether they came from a flag or the
#: environment. The port is per child: child *i* listens on the port + *i*.
HTTP_SETTINGS = ("http_host", "http_enabled")


def child_environments(
    env: Mapping[str, str], settings: Settings, processes: int, *, port_chosen: bool = True
) -> list[dict[str, str]]:
    """The environment of each of ``processes`` children.

    When the worker serves HTTP (``worker.http_port``), N processes cannot share one
    port: child *i* gets ``worker.http_port + i`` (0, any free port, stays 0), so each
    child is scraped on its own port. Without that setting the environments are equal.
    A port nobody chose (``port_chosen=False``: the default) is not put in the
    environment: each child gets it as a port to try first (:func:`child_commands`),
    and a taken one gives way to a free port instead of a crash loop.
    """
    worker = settings.worker
    port = getattr(worker, "http_port", None)
    shared = dict(env)
    for name in HTTP_SETTINGS:
        value = getattr(worker, name, None)
        if value is not None:
            text = str(value).lower() if isinstance(value, bool) else str(value)
            shared[f"STREAMWORKS_WORKER__{name.upper()}"] = text
    envs = []
    for index in range(processes):
        child = dict(shared)
        if isinstance(port, int) and port_chosen:
            child["STREAMWORKS_WORKER__HTTP_PORT"] = str(port + index if port else 0)
        envs.append(child)
    return envs


def child_commands(
    argv: Sequence[str], settings: Settings, processes: int, *, port_chosen: bool
) -> list[list[str]]:
    """Each child's command: ``argv``, plus, when nobody chose the port, the port
    child *i* tries first (the default + *i*)."""
    port = settings.worker.http_port
    if port_chosen or not port:
        return [list(argv)] * processes
    return [[*argv, "--default-http-port", str(port + i)] for i in range(processes)]


def supervise_workers(
    target: str,
    processes: int,
    settings: Settings,
    flags: Mapping[str, object],
    options: Sequence[str],
    *,
    port_chosen: bool = True,
) -> int:
    """Run ``processes`` children ``streamworks worker target *options``; the exit code.

    Flags given on the command line (``--redis``, ``--coordinator``, tokens, ...) reach
    the children as ``STREAMWORKS_*`` variables, not arguments: a token on a command
    line is visible to every user of the host in ``ps``.
    """
    env = dict(os.environ)
    for name, value in flags.items():
        if value is not None:
            env[f"STREAMWORKS_{name.upper()}"] = str(value)
    argv = [sys.executable, "-m", "streamworks", "worker", target, *options]
    log.info(
        "supervising %d worker processes of %s (restarts: %g s doubling up to %g s; "
        "gives up after more than %d crashes within %g s)",
        processes,
        target,
        settings.supervisor.restart_delay,
        settings.supervisor.restart_delay_max,
        settings.supervisor.max_crashes,
        settings.supervisor.crash_window,
    )
    envs = child_environments(env, settings, processes, port_chosen=port_chosen)
    commands = child_commands(argv, settings, processes, port_chosen=port_chosen)
    supervisor = Supervisor(commands, envs, settings.supervisor)
    code = supervisor.run()
    if supervisor.gave_up is not None:
        click.echo(f"error: {supervisor.gave_up}", err=True)
    return code
