"""The streamworks error tree.

Every error streamworks raises derives from :class:`StreamworksError`::

    StreamworksError
    ├── ConfigurationError (ValueError)    bad settings, handler signatures, names
    │   ├── NamespaceMismatchError         not the coordinator's Redis or key prefix
    │   └── UnknownNameError               a stream, group or dead letter the namespace lacks
    ├── DecodeError                        an entry or payload that cannot be decoded (poison)
    ├── BackendError                       Redis failed or answered something unexpected
    ├── PublishError                       a message could not be published
    │   ├── NoShardsError                  the stream has zero shards (E14)
    │   ├── PublishNotDurableError         written, but too few replicas acknowledged in time
    │   ├── RoutingUnavailableError        routing lease expired without refresh (E1), retryable
    │   └── ShardRetiredError              routing kept pointing at retired shards (E16)
    ├── CoordinatorError                   the coordinator answered with an error
    │   └── CoordinatorUnavailableError    no coordinator URL answered, retryable
    ├── NotConnectedError                  publishing from an app with no open connection
    └── StartupError                       an on_startup hook (or the lifespan) failed

Losing a shard is not an error anybody sees: a read refused by the owner fence, or a
lease that ran out, makes the member stop reading that shard (or pause), and the
entries stay pending for the shard's owner (see ``runtime/reader.py``).

Control-flow signals a handler raises are *not* errors and live apart, under
:class:`HandlerSignal`: :class:`Retry` and :class:`Skip`.
"""

from __future__ import annotations

from typing import Any

__all__ = (
    "BackendError",
    "ConfigurationError",
    "CoordinatorError",
    "CoordinatorUnavailableError",
    "DecodeError",
    "HandlerSignal",
    "NamespaceMismatchError",
    "NoShardsError",
    "NotConnectedError",
    "PublishError",
    "PublishNotDurableError",
    "Retry",
    "RoutingUnavailableError",
    "ShardRetiredError",
    "Skip",
    "StartupError",
    "StreamworksError",
    "UnknownNameError",
)


class StreamworksError(Exception):
    """Root of every error raised by streamworks."""


class ConfigurationError(StreamworksError, ValueError):
    """Invalid settings, names or handler declarations."""


class NamespaceMismatchError(ConfigurationError):
    """This process's Redis (server, database) or key prefix is not its coordinator's:
    the namespace id the coordinator sent is not the one this Redis holds
    (``streamworks.redis.namespace``)."""


class UnknownNameError(ConfigurationError):
    """A stream, group or dead-letter entry the namespace does not know (a typo would
    otherwise look like an empty table, or act on nothing)."""


class DecodeError(StreamworksError):
    """A stream entry or its payload cannot be decoded: a poison message."""


class BackendError(StreamworksError):
    """Redis failed, or answered in a way streamworks does not expect."""


class PublishError(StreamworksError):
    """A message could not be published."""

    retryable: bool = False


class NoShardsError(PublishError):
    """The stream's routing has zero shards (E14)."""


class PublishNotDurableError(PublishError):
    """Durable publishing (``min_replicas``): the entries were written to the shard's
    primary, but fewer replicas than asked acknowledged them before the timeout, so a
    failover may still lose them. Retrying is safe with an ``event_id`` and a dedup
    window (the retry is then a duplicate, not a second entry); without, a retry may
    write a message twice.

    Attributes:
        published: every record of the call, in order (all of them were written).
        not_durable: those whose replicas did not acknowledge in time.
    """

    retryable = True

    def __init__(self, message: str, *, published: list[Any], not_durable: list[Any]):
        super().__init__(message)
        self.published = published
        self.not_durable = not_durable


class RoutingUnavailableError(PublishError):
    """The routing lease expired and could not be refreshed; publishing fails closed (E1)."""

    retryable = True


class ShardRetiredError(PublishError):
    """Publishing kept hitting retired shards after bounded routing refreshes (E16)."""

    retryable = True


class CoordinatorError(StreamworksError):
    """The coordinator answered a request with an error.

    Attributes:
        code: the API error code, e.g. ``CONFLICT`` or ``METADATA_UNAVAILABLE``.
        retryable: whether the same request may succeed later without operator action.
    """

    def __init__(self, code: str, message: str, *, retryable: bool = False, status: int = 0):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.retryable = retryable
        self.status = status


class CoordinatorUnavailableError(CoordinatorError):
    """No configured coordinator URL answered."""

    def __init__(self, message: str):
        super().__init__("COORDINATOR_UNAVAILABLE", message, retryable=True)


class NotConnectedError(StreamworksError):
    """The app has no open connection; use ``async with app.connect()``."""


class StartupError(StreamworksError):
    """An ``on_startup`` hook or the app's lifespan raised: the process did not start
    (the hook's exception is the ``__cause__``)."""


class HandlerSignal(Exception):
    """Base of the control-flow signals a handler may raise."""


class Retry(HandlerSignal):
    """Ask for the message to be retried after ``delay`` seconds (counts as an attempt).

    With ``delay=None`` the handler's retry policy chooses the backoff.
    """

    def __init__(self, delay: float | None = None, reason: str = "retry requested"):
        reason = "retry requested" if reason is None else str(reason)
        super().__init__(reason)
        # When the retry is scheduled: a negative or NaN delay means now, an infinite
        # one the policy's backoff, and any delay is capped at a day.
        self.delay = None if delay is None else float(delay)
        self.reason = reason


class Skip(HandlerSignal):
    """Acknowledge the message without processing it further."""
