"""The pytest examples of ``docs/testing.md`` pass copied as written into a project of
a user's own (issue 22, item 2): a directory outside this repository, with no
conftest, no pytest configuration, nothing but the page's code, run by this
environment's ``pytest`` in a subprocess.

Before, every ``async def`` test there failed ("async def functions are not natively
supported"), and with ``@pytest.mark.anyio`` added the ``[trio]`` variants failed
(the ``dev`` extra installs trio; redis-py's client is asyncio-only)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "testing.md"
#: A ```python block of the page.
BLOCK = re.compile(r"```python\n(?P<code>.*?)```", re.S)

pytestmark = pytest.mark.timeout(300)


def page_tests() -> list[str]:
    """The page's code blocks that are pytest test modules."""
    found = [
        m["code"]
        for m in BLOCK.finditer(PAGE.read_text())
        if "\ndef test_" in m["code"] or "\nasync def test_" in m["code"]
    ]
    assert len(found) >= 2, "docs/testing.md lost its pytest examples"
    return found


def run_project(project: Path) -> subprocess.CompletedProcess[str]:
    """pytest on ``project`` as its user would run it: from inside it, with its own
    rootdir; nothing of this repository on the path or in the configuration."""
    # The suite's own switches (CI's second run sets a single-node target and ACL users)
    # are this repository's configuration, not the user's.
    ours = (
        "PYTHONPATH",
        "PYTEST_ADDOPTS",
        "STREAMWORKS_TEST_REDIS_TARGET",
        "STREAMWORKS_TEST_REDIS_ACL",
    )
    env = {k: v for k, v in os.environ.items() if k not in ours}
    pytest_bin = Path(sys.executable).with_name("pytest")
    return subprocess.run(
        [str(pytest_bin), "-p", "no:cacheprovider", "--rootdir", str(project), "-rA", "-q"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )


def outside_project(tmp_path: Path) -> Path:
    project = tmp_path / "userproject"
    project.mkdir()
    assert REPO not in project.parents
    return project


def test_the_pages_pytest_examples_pass_in_a_project_of_ones_own(tmp_path: Path) -> None:
    project = outside_project(tmp_path)
    blocks = page_tests()
    for i, code in enumerate(blocks):
        (project / f"test_page_{i}.py").write_text(code)
    result = run_project(project)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    assert "not natively supported" not in output
    passed = re.search(r"(\d+) passed", output)
    expected = sum(len(re.findall(r"^(?:async )?def test_", c, re.M)) for c in blocks)
    assert passed is not None and int(passed[1]) == expected, output[-3000:]
    assert "failed" not in output.splitlines()[-1], output[-3000:]


def test_marked_anyio_they_run_on_asyncio_only(tmp_path: Path) -> None:
    """The usual next attempt of a user: ``@pytest.mark.anyio`` on each test. anyio
    would add a ``[trio]`` variant of each; the plugin drops them (deselected)."""
    project = outside_project(tmp_path)
    code = page_tests()[0]
    marked = re.sub(r"^async def test_", "@pytest.mark.anyio\nasync def test_", code, flags=re.M)
    marked = marked.replace("\nimport anyio\n", "\nimport anyio\nimport pytest\n", 1)
    assert "import pytest" in marked
    (project / "test_marked.py").write_text(marked)
    result = run_project(project)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    assert "[trio]" not in output.replace("deselected", ""), output[-3000:]
    assert re.search(r"\d+ passed, \d+ deselected", output), output[-3000:]
