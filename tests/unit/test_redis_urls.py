"""Redis URLs: a cluster's seed list, and passwords masked wherever a URL is printed."""

from __future__ import annotations

import pytest

from streamworks.redis.client import masked_url, seed_urls


def test_seed_urls_split_on_commas_and_drop_blanks() -> None:
    assert seed_urls("redis://a:1/0") == ["redis://a:1/0"]
    assert seed_urls(" redis://a:1 , redis://b:2,") == ["redis://a:1", "redis://b:2"]
    with pytest.raises(ValueError):
        seed_urls(" , ")


def test_every_seeds_password_is_masked() -> None:
    assert masked_url("redis://u:pw@a:1/0") == "redis://u:***@a:1/0"
    assert masked_url("redis://a:1/0") == "redis://a:1/0"
    assert masked_url("rediss://:s3cret@a:1/0,rediss://:s3cret@b:2/0") == (
        "rediss://:***@a:1/0,rediss://:***@b:2/0"
    )
