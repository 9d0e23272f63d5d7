"""What the studio's browser tests share: one headless Chromium (its console kept), a
conversation that did not happen in the studio, the studio opened on a funnel."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from engine.studio import Studio

ROOT = Path(__file__).resolve().parent.parent


def chromium() -> tuple[str, str]:
    """The browser and its driver, or the test is skipped (failed on CI)."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not (browser and driver):
        message = "chromium and chromium-driver are needed: apt-get install -y chromium chromium-driver"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return browser, driver


@contextmanager
def headless_chromium(profile: Path) -> Iterator[Any]:
    """A headless Chromium (the widget test's flags), its console log kept."""
    browser, driver_path = chromium()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    os.environ["SE_OFFLINE"] = "true"  # never let selenium-manager download anything
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--window-size=1500,1000",
                 f"--user-data-dir={profile}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    d = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
    try:
        yield d
    finally:
        d.quit()


def real_session(funnel: Path, db: str, session: str = "tg-real-1",
                 texts: Sequence[str] = ("Hi!", "I have a Sphynx cat, her skin is very dry"),
                 model: Any = None) -> str:
    """A conversation that did not happen in the studio: the demo script (or ``model``)
    via the Engine, on the Telegram channel."""
    from engine import Engine
    from engine.llm.models import ScriptedModel

    async def play() -> None:
        chosen = model or ScriptedModel.from_file(ROOT / "funnels" / "puramur" / "demo.yaml")
        # A production engine (`funnel serve`'s): it deploys the copy it runs.
        async with await Engine.open(funnel, db=db, model=chosen, deploy=True) as engine:
            for text in texts:
                await engine.handle(session, text, channel="telegram")

    asyncio.run(play())
    return session


def opener(funnel: Path, db: str) -> Any:
    async def opened() -> Studio:
        return await Studio.open([funnel], db=db)
    return opened
