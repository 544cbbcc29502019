"""docs/guarantees.md states every seed requirement and indexes its tests."""

from __future__ import annotations

import re

from tests.docs.seed_index import PAGE, collect, current_page


def test_every_requirement_is_stated_and_tested() -> None:
    text = PAGE.read_text()
    found = collect()
    for n in range(1, 25):
        assert re.search(rf"\*\*E{n} — ", text), f"E{n} is not stated in guarantees.md"
        assert found.get(f"E{n}"), f"no test is marked @pytest.mark.seed('E{n}')"


def test_the_test_index_is_current() -> None:
    assert PAGE.read_text() == current_page(), (
        "docs/guarantees.md's test index is stale: run `python -m tests.docs.seed_index --write`"
    )
