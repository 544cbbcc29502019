"""Every code example in docs/ runs, and the pages show the examples verbatim."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"
EXAMPLES = sorted((DOCS / "examples").glob("*.py"))
INCLUDE = re.compile(r"<!-- example: (?P<path>[\w/.-]+) -->\n```python\n(?P<code>.*?)```", re.S)


def load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"docs_example_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: Examples that are pytest tests, run by a test of their own below.
AS_TESTS = ("testing", "testing_cluster")


@pytest.mark.parametrize(
    "path", [p for p in EXAMPLES if p.stem not in AS_TESTS], ids=lambda p: p.stem
)
async def test_example_runs(
    path: Path, streamworks_redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STREAMWORKS_TEST_REDIS_URL", streamworks_redis_url)
    await load(path).main()


async def test_testing_example(streamworks_runtime: object) -> None:
    module = load(DOCS / "examples" / "testing.py")
    await module.test_welcome_mails(streamworks_runtime)
    await module.test_reminder_an_hour_later(streamworks_runtime)


async def test_testing_cluster_example(local_cluster: object) -> None:
    module = load(DOCS / "examples" / "testing_cluster.py")
    await module.test_a_key_survives_a_failover(local_cluster)


def test_pages_quote_examples_verbatim() -> None:
    quoted = 0
    for page in DOCS.glob("*.md"):
        for match in INCLUDE.finditer(page.read_text()):
            source = (DOCS.parent / match["path"]).read_text()
            assert match["code"] == source, f"{page.name} quotes a stale copy of {match['path']}"
            quoted += 1
    assert quoted >= len(EXAMPLES)
