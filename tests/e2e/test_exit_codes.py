"""One exit-code table (issue 22, item 9): the table of ``docs/cli.md``, and each case
it names run as a real subprocess, one error line and the code the table gives.

(Before: an unknown stream exited 1 in ``publish``/``streams`` and 2 in ``dlq``; a port
in use 2 in ``coordinator`` and 1 in ``worker``; ``admin reinit`` without a terminal
printed its prompt and exited 1.)"""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from streamworks.redis.keyspace import Keyspace
from tests.e2e.harness import (
    GROUP,
    INSTRUMENTED,
    STREAM,
    Cluster,
    create_stream,
    free_port,
    wait_ready,
)
from tests.e2e.test_cli import assert_one_error_line, text

DOCS = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def documented() -> dict[int, str]:
    """``exit code -> meaning`` from the one table of docs/cli.md."""
    table = re.search(
        r"\| exit code \| meaning \|\n\|---\|---\|\n((?:\|.*\|\n)+)", DOCS.read_text()
    )
    assert table is not None, "docs/cli.md lost its exit-code table"
    rows = {}
    for line in table[1].splitlines():
        code, meaning = (cell.strip() for cell in line.strip("|").split("|", 1))
        rows[int(code)] = meaning
    assert set(rows) == {0, 1, 2, 130}, rows
    return rows


@contextmanager
def taken_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


async def test_every_documented_case_exits_with_its_code(cluster: Cluster, redis: Any) -> None:
    table = documented()
    coordinator = cluster.start_coordinator()
    await wait_ready(coordinator)
    await create_stream(cluster)
    closed = free_port()
    # A dead letter of the group: its dead-letter stream exists (a purge asks first).
    dead_letters = Keyspace(cluster.prefix).dead_letters(GROUP, STREAM)
    await redis.xadd(dead_letters, {"reason": "poison", "error": "x", "o.v": b"x"})

    # (the words of the table's row that name the case, the command, its error line)
    cases: list[tuple[int, str, list[str], str]] = [
        (2, "unknown stream", ["publish", "nosuch", "{}"], "'nosuch'"),
        (2, "`streams show/scale`", ["streams", "show", "nosuch"], "unknown stream 'nosuch'"),
        (2, "`streams show/scale`", ["streams", "scale", "nosuch", "--shards", "2"], "nosuch"),
        (2, "`dlq`", ["dlq", "show", GROUP, "nosuch"], "unknown stream 'nosuch'"),
        (2, "group", ["dlq", "show", "nosuch", STREAM], "unknown group 'nosuch'"),
        (2, "dead letter", ["dlq", "delete", GROUP, STREAM, "1-0", "--yes"], "no dead letter"),
        (2, "usage error", ["streams", "create", STREAM], "--shards"),
        (2, "invalid name", ["streams", "create", "bad name", "--shards", "1"], "invalid"),
        (2, "`dlq delete/purge`", ["dlq", "purge", GROUP, STREAM], "--yes"),
        (2, "`streams scale --shards 0`", ["streams", "scale", STREAM, "--shards", "0"], "--yes"),
        (2, "`admin reinit`", ["admin", "reinit", "group", GROUP], "--yes"),
        (
            1,
            "Redis unreachable",
            ["dlq", "ls", "--redis", f"redis://127.0.0.1:{closed}/0"],
            "Redis",
        ),
        (
            1,
            "the coordinator unreachable",
            ["status", "--coordinator", f"http://127.0.0.1:{closed}"],
            "coordinator",
        ),
        (
            1,
            "namespace check refused",
            ["publish", STREAM, "{}", "--key-prefix", f"{cluster.prefix}-other"],
            "namespace mismatch",
        ),
        (1, "a bad input line", ["publish", STREAM, "-"], "stdin line 1"),
    ]
    for code, words, args, fragment in cases:
        assert words in table[code], f"docs/cli.md: exit {code} does not name {words!r}"
        stdin = b"not json\n" if args[-1] == "-" else None
        result = await cluster.cli(*args, input=stdin)
        try:
            assert_one_error_line(result, fragment)
            assert result.returncode == code, result.returncode
        except AssertionError as e:
            raise AssertionError(f"{args}: {e}") from None

    # Asked without a terminal: refused at once, the prompt never printed.
    refused = await cluster.cli("admin", "reinit", "group", GROUP)
    assert "[y/N]" not in text(refused)[0] + text(refused)[1]

    # A port in use, whichever command listens.
    assert "a port in use" in table[2]
    with taken_port() as port:
        for name, args in (
            ("`coordinator --port`", ["coordinator", "--port", str(port)]),
            ("`worker --http-port`", ["worker", INSTRUMENTED, "--http-port", str(port)]),
            (
                "`dev --port`",
                ["dev", INSTRUMENTED, "--port", str(port), "--redis", cluster.redis_url],
            ),
        ):
            assert name in table[2], f"docs/cli.md: exit 2 does not name {name}"
            result = await cluster.cli(*args, timeout=60)
            try:
                assert_one_error_line(result, f"127.0.0.1:{port}")
                assert result.returncode == 2, result.returncode
            except AssertionError as e:
                raise AssertionError(f"{args}: {e}") from None
