"""Headless Chromium for page tests (Debian's chromium, driven by Playwright)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    # The machine has no network; these keep Chromium from trying.
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
DOCS = Path(__file__).resolve().parents[2] / "docs"


def chromium_path() -> str | None:
    return (
        os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    )


@pytest.fixture(scope="module")
def chromium() -> Iterator[object]:
    """Module-scoped: Playwright's sync API keeps an event loop running in this
    thread while it is open, which would break asyncio tests in other modules."""
    path = chromium_path()
    if path is None:
        message = "Chromium is not installed (apt-get install chromium); .ci/run installs it"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    from playwright.sync_api import sync_playwright

    # Playwright's sync API keeps an event loop running in this thread, which
    # makes Django refuse ORM calls from the test; the test process is not
    # serving requests, so its ORM use is safe.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=path, args=CHROMIUM_FLAGS)
            yield browser
            browser.close()
    finally:
        os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)


def log_in(page: object, base_url: str, token: str, next_path: str) -> None:
    page.goto(f"{base_url}/login/?next={next_path}")
    page.fill("input[name=token]", token)
    page.click("button[type=submit]")


def save_screenshot(page: object, name: str, tmp_path: Path) -> Path:
    """Into the test's folder; also into docs/ when GPUSCHED_SCREENSHOTS=1."""
    target = tmp_path / name
    page.screenshot(path=str(target), full_page=True)
    if os.environ.get("GPUSCHED_SCREENSHOTS") == "1":
        shutil.copy(target, DOCS / name)
    return target
