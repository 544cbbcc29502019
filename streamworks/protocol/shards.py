"""Shard identity: ``stream/index@incarnation``.

A shard is one Redis Stream key. Its id names the logical stream, its index in
the routing order, and an incarnation counter so that an index re-created after a
scale-in never reuses a key that may still be draining.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from streamworks.exceptions import ConfigurationError

__all__ = ("NAME_PATTERN", "ShardId", "validate_name")

#: Stream and group names: safe inside Redis keys, URLs and shard ids. Use it with
#: ``fullmatch`` (``match`` with ``$`` would accept a trailing newline).
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
_SHARD_ID = re.compile(
    r"(?P<stream>[A-Za-z0-9][A-Za-z0-9._-]{0,99})/(?P<index>[0-9]{1,6})@(?P<inc>[0-9]{1,9})"
)


def validate_name(kind: str, name: str) -> str:
    """Return ``name`` if it is a valid stream/group name, else raise ConfigurationError."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise ConfigurationError(
            f"invalid {kind} name {name!r}: use 1-100 of A-Z a-z 0-9 . _ - "
            "starting with a letter or digit"
        )
    return name


@dataclass(frozen=True, slots=True, order=True)
class ShardId:
    """One shard of a stream: ``orders/3@2`` is index 3 of ``orders``, incarnation 2."""

    stream: str
    index: int
    incarnation: int = 0

    def __str__(self) -> str:
        return f"{self.stream}/{self.index}@{self.incarnation}"

    @classmethod
    def parse(cls, text: str) -> ShardId:
        """Parse ``stream/index@incarnation``; raise ConfigurationError when malformed."""
        m = _SHARD_ID.fullmatch(text) if isinstance(text, str) else None
        if m is None:
            raise ConfigurationError(
                f"invalid shard id {text!r}: expected stream/index@incarnation"
            )
        return cls(m["stream"], int(m["index"]), int(m["inc"]))
