"""Headless Chromium for the browser tests, driven by Selenium through Debian's
``chromium`` and ``chromium-driver`` packages (nothing is downloaded: the driver's
path is given, and Selenium Manager is switched off). Without them, every test here
is skipped with the reason.

Screenshots go to the test's temporary directory, and also to
``$STREAMWORKS_SCREENSHOTS`` when it is set (``make screenshots`` sets it to
``docs/img``, the pictures ``docs/dashboard.md`` shows).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from streamworks.settings import Settings
from tests.e2e.harness import Cluster

CHROMIUM = ("/usr/bin/chromium", "/usr/bin/chromium-browser")
CHROMEDRIVER = ("/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver")
FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-quic",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--window-size=1400,1200",
)


def _first(paths: tuple[str, ...], name: str) -> str | None:
    for path in paths:
        if os.access(path, os.X_OK):
            return path
    return shutil.which(name)


@pytest.fixture
def browser(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A headless Chromium (a Selenium WebDriver) with a profile of its own."""
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
    chromium = _first(CHROMIUM, "chromium")
    driver_path = _first(CHROMEDRIVER, "chromedriver")
    if chromium is None or driver_path is None:
        pytest.skip("no chromium/chromedriver (apt-get install chromium chromium-driver)")
    monkeypatch.setenv("SE_OFFLINE", "true")  # Selenium Manager never downloads anything
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path / 'chromium-profile'}")
    service = webdriver.ChromeService(
        executable_path=driver_path, log_output=str(tmp_path / "chromedriver.log")
    )
    driver = webdriver.Chrome(options=options, service=service)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def screenshots(tmp_path: Path) -> list[Path]:
    """Where to save screenshots: the test's directory, and ``$STREAMWORKS_SCREENSHOTS``."""
    dirs = [tmp_path]
    extra = os.environ.get("STREAMWORKS_SCREENSHOTS")
    if extra:
        Path(extra).mkdir(parents=True, exist_ok=True)
        dirs.append(Path(extra))
    return dirs


@pytest.fixture
async def cluster(settings: Settings, redis: Any, tmp_path: Path) -> Any:
    """Processes on the test's Redis and key prefix, killed at teardown (see
    ``tests/e2e/conftest.py``)."""
    procs = Cluster(settings.redis_url, settings.key_prefix, tmp_path)
    try:
        yield procs
    finally:
        procs.kill_all()
        print(procs.report())
