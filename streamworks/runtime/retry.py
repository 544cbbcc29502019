"""Retry policy: how often and how late a failed message is tried again."""

from __future__ import annotations

import random
from dataclasses import dataclass

from streamworks.exceptions import ConfigurationError

__all__ = ("RetryPolicy",)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Exponential, jittered backoff with an attempt cap.

    Attempt ``n`` (n >= 1 failures so far) waits ``min(max_backoff, backoff * 2**(n-1))``
    scaled by a random factor in ``[0.5, 1.0]`` ("equal jitter"), so retries of many
    messages that failed together spread out. After ``max_attempts`` failed attempts
    the message goes to the dead-letter stream.
    """

    max_attempts: int = 5
    backoff: float = 0.5
    max_backoff: float = 30.0
    jitter: bool = True

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ConfigurationError("RetryPolicy.max_attempts must be >= 1")
        if self.backoff < 0 or self.max_backoff < 0:
            raise ConfigurationError("RetryPolicy backoffs must be >= 0")

    def delay(self, failures: int) -> float:
        """Seconds to wait before the attempt that follows ``failures`` failures."""
        base = min(self.max_backoff, self.backoff * 2.0 ** max(0, failures - 1))
        if self.jitter:
            return float(base * (0.5 + random.random() / 2))
        return base
