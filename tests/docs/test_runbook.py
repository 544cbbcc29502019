"""The operational pages give commands that exist: every ``streamworks`` command line
in their shell blocks parses with the real CLI, and every STREAMWORKS_* variable they
name is a setting."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tests.deploy.support import allowed_env_names, check_command_line

DOCS = Path(__file__).resolve().parents[2] / "docs"
PAGES = ("runbook.md", "deploy.md", "examples.md", "quickstart.md", "install.md")
SHELL = re.compile(r"```(?:sh|bash|console)\n(?P<body>.*?)```", re.S)
ENV = re.compile(r"\bSTREAMWORKS_[A-Z0-9_]+")
#: Variables of the test suite and the embedded server, not settings of processes.
TEST_ENV = {
    "STREAMWORKS_TEST_REDIS_URL",
    "STREAMWORKS_TEST_POSTGRES_URL",
    "STREAMWORKS_REDIS_SERVER",
}


def command_lines(page: str) -> list[list[str]]:
    """The arguments after ``streamworks`` of each command line in the page's shell
    blocks: ``kubectl exec ... -- streamworks status`` counts too, and so does
    ``docker run ... streamworks:local worker ...`` (the image's entrypoint)."""
    found = []
    for block in SHELL.finditer((DOCS / page).read_text()):
        for line in block["body"].splitlines():
            words = shlex.split(line, comments=True)
            if words[:2] == ["docker", "build"] or words[:1] == ["pip"]:
                continue  # names the image or the package, runs nothing
            for program in ("streamworks", "streamworks:local"):
                if program in words:
                    args = words[words.index(program) + 1 :]
                    if args[:1] != ["--help"]:
                        found.append(args)
    return found


@pytest.mark.parametrize("page", PAGES)
def test_every_command_exists(page: str) -> None:
    lines = command_lines(page)
    assert lines, f"{page} shows no streamworks command"
    for args in lines:
        check_command_line(args)


def test_the_runbook_covers_the_seed_questions() -> None:
    headings = re.findall(r"^## (.+)$", (DOCS / "runbook.md").read_text(), re.M)
    assert headings == [
        "Coordinator rolling restart",
        "Redis restart or failover",
        "Redis lost its data",
        "All members gone",
        "A shard stuck DRAINING",
        "A poison message",
        "A DLQ flood",
        "Adding a consumer group",
    ]


@pytest.mark.parametrize("page", PAGES)
def test_every_variable_is_a_setting(page: str) -> None:
    named = set(ENV.findall((DOCS / page).read_text())) - TEST_ENV
    unknown = named - allowed_env_names()
    assert not unknown, f"{page} names variables that are not settings: {sorted(unknown)}"


def test_a_wrong_command_is_caught() -> None:
    with pytest.raises(AssertionError, match="no subcommand"):
        check_command_line(["dlq", "flush", "billing", "orders"])
    with pytest.raises(AssertionError, match="--force"):
        check_command_line(["dlq", "purge", "billing", "orders", "--force"])
