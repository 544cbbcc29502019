"""Dead letters as a library: list, show, replay, delete and purge
(``library.py`` says how; ``docs/dlq.md`` has the guide).

``streamworks dlq`` and the coordinator's dashboard are both shells over it; it
imports neither the coordinator nor the runtime (``.importlinter``).
"""

from __future__ import annotations

from streamworks.dlq.library import DeadLetters
from streamworks.dlq.records import (
    REASONS,
    DeadLetter,
    DeadLetterStream,
    Kept,
    Replayed,
    ReplayError,
    ReplayResult,
    Selection,
    parse_age,
)
from streamworks.dlq.routing import RoutingAnswers

__all__ = (
    "REASONS",
    "DeadLetter",
    "DeadLetterStream",
    "DeadLetters",
    "Kept",
    "ReplayError",
    "ReplayResult",
    "Replayed",
    "RoutingAnswers",
    "Selection",
    "parse_age",
)
