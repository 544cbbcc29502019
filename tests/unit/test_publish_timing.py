"""``streamworks publish --delay/--at``: every bad input is one error line and exit 2,
decided before anything is sent (the real subprocess runs two of these cases in
tests/e2e/test_delays.py; each CLI process costs seconds on a loaded machine)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from streamworks.cli.publish import _timing


@pytest.mark.parametrize(
    ("delay", "at", "fragment"),
    [
        ("-5s", None, "is negative"),
        ("5", None, "use a number and a unit"),
        ("0s", None, "must be more than zero"),
        ("400d", None, "more than 366 days"),
        (None, "2030-01-01T09:00:00", "has no UTC offset"),
        (None, "tomorrow", "not an ISO 8601 time"),
        (None, "2099-01-01T09:00:00+00:00", "days ahead"),
        ("1s", "2030-01-01T09:00:00Z", "not both"),
    ],
)
def test_bad_timing_is_one_line_and_exit_2(
    delay: str | None, at: str | None, fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        _timing(delay, at)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and fragment in err, err


def test_good_timing_becomes_the_records_delay_or_at() -> None:
    assert _timing(None, None) == {}
    assert _timing("1.5h", None) == {"delay": timedelta(hours=1.5)}
    soon = (datetime.now(UTC) + timedelta(days=10)).replace(microsecond=0)
    paris = soon.astimezone(timezone(timedelta(hours=1))).isoformat()
    at = _timing(None, paris)["at"]
    assert at == soon
    assert _timing(None, soon.isoformat().replace("+00:00", "Z"))["at"] == at
