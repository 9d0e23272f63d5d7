"""Funnel Studio's figures, and the screenshots of docs/studio.md, from the real page.

- page weight: the bytes of the page's HTML, JavaScript and CSS (and gzipped);
- save -> reloaded page: a copy of Puramur is edited on disk while headless Chromium
  has the studio open; the time until the page says "reloaded" (SAVES times);
- turn time with and without a page watching: TURNS turns of the service's own engine
  (the scripted model, a real PostgreSQL), first with no studio, then with the studio
  open in Chromium on the same database, polling as it does. The studio adds nothing
  to those turns (it has its own engine); the figure shows what a watching page costs
  on the machine.

Run: ``PYTHONPATH=. python bench/studio.py [--db URL] [--saves 5] [--turns 60] [--shots]``
(``--shots`` rewrites docs/studio/*.png). Needs chromium and chromium-driver.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import os
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import uvicorn  # noqa: E402

from bench._db import server_url, throwaway_schema  # noqa: E402
from engine import Engine  # noqa: E402
from engine.llm.models import ScriptedModel  # noqa: E402
from engine.studio import Studio, create_studio_app  # noqa: E402
from engine.studio.app import STATIC  # noqa: E402

SHOTS = ROOT / "docs" / "studio"
DEMO = ROOT / "funnels" / "puramur" / "demo.yaml"


def copy_puramur(root: Path) -> Path:
    (root / "funnels" / "puramur").mkdir(parents=True)
    (root / "pyproject.toml").write_text("")
    shutil.copy(ROOT / "funnels" / "puramur.yaml", root / "funnels" / "puramur.yaml")
    shutil.copy(ROOT / "funnels" / "puramur" / "catalog.yaml", root / "funnels" / "puramur")
    shutil.copytree(ROOT / "funnels" / "puramur" / "knowledge", root / "funnels" / "puramur" / "knowledge")
    shutil.copytree(ROOT / "prompts" / "puramur", root / "prompts" / "puramur")
    return root / "funnels" / "puramur.yaml"


@contextmanager
def serving(app: Any) -> Iterator[str]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(30)


def chromium(profile: Path) -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    os.environ["SE_OFFLINE"] = "true"
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--window-size=1360,860",
                 "--hide-scrollbars", f"--user-data-dir={profile}"):
        options.add_argument(flag)
    return webdriver.Chrome(options=options,
                            service=Service(executable_path=shutil.which("chromedriver")))


def page_weight() -> None:
    from engine.studio.app import ASSETS  # every file the page may load

    files = ["studio.html", *ASSETS]
    raw = sum((STATIC / f).stat().st_size for f in files)
    packed = sum(len(gzip.compress((STATIC / f).read_bytes())) for f in files)
    print(f"page weight: {raw} bytes ({packed} gzipped) of HTML+JS+CSS in {len(files)} files, "
          "no other request but the studio's JSON (the stage graph's SVG comes in it)")


def turns(funnel: Path, db: str, n: int, tag: str) -> list[float]:
    async def play() -> list[float]:
        model = ScriptedModel.from_file(DEMO)
        out = []
        async with await Engine.open(funnel, db=db, model=model) as engine:
            for i in range(n):
                started = time.perf_counter()
                await engine.handle(f"{tag}-{i // 6}", "I have a Sphynx cat" if i % 6 else "Hi!")
                out.append((time.perf_counter() - started) * 1000)
        return out
    return asyncio.run(play())


def say(d: Any, text: str, reply: str, fields: dict[str, Any]) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    before = d.execute_script("return document.querySelectorAll('#log .turn').length")
    tid = lambda name: d.find_element(By.CSS_SELECTOR, f'[data-testid="{name}"]')  # noqa: E731
    tid("chat-input").send_keys(text)
    tid("field-reply").send_keys(reply)
    for path, value in fields.items():
        box = tid(f"field-{path}")
        if box.tag_name == "select":
            for v in value if isinstance(value, list) else [value]:
                Select(box).select_by_visible_text(v)
        else:
            box.send_keys(str(value))
    tid("model-form-submit").click()
    WebDriverWait(d, 30).until(lambda _: d.execute_script(
        "return document.querySelectorAll('#log .turn').length") > before)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default=os.environ.get("FUNNEL_DB"))
    parser.add_argument("--saves", type=int, default=5)
    parser.add_argument("--turns", type=int, default=60)
    parser.add_argument("--shots", action="store_true")
    args = parser.parse_args()
    page_weight()
    with tempfile.TemporaryDirectory() as tmp, throwaway_schema(server_url(args.db)) as db:
        funnel = copy_puramur(Path(tmp) / "project")
        turns(funnel, db, 6, "warm")
        alone = turns(funnel, db, args.turns, "alone")

        async def opened() -> Studio:
            return await Studio.open([funnel], db=db)

        with serving(create_studio_app(opened)) as url:
            d = chromium(Path(tmp) / "profile")
            try:
                d.get(url + "/")
                time.sleep(1.5)
                watched = turns(funnel, db, args.turns, "watched")
                for label, ms in (("no page", alone), ("a page watching", watched)):
                    print(f"turn time, {label}: median {statistics.median(ms):.1f} ms, "
                          f"p90 {sorted(ms)[int(len(ms) * 0.9)]:.1f} ms ({len(ms)} turns)")
                good = funnel.read_text("utf-8")
                waits = []
                for i in range(args.saves):
                    seen = d.execute_script("return document.getElementById('notice').dataset"
                                            ".generation || '0'")
                    funnel.write_text(good.replace("Build the pet profile",
                                                   f"Build the pet profile ({i})"), "utf-8")
                    started = time.perf_counter()
                    while d.execute_script("return document.getElementById('notice').dataset"
                                           ".generation || '0'") == seen:
                        time.sleep(0.005)
                    waits.append((time.perf_counter() - started) * 1000)
                print(f"file save -> page says reloaded: median {statistics.median(waits):.0f} ms, "
                      f"worst {max(waits):.0f} ms ({len(waits)} saves; the studio polls files "
                      "every 0.25 s and waits one more look for the save to settle, the page "
                      "polls every 0.4 s)")
                if args.shots:
                    shots(d, url, funnel, good)
            finally:
                d.quit()


def shots(d: Any, url: str, funnel: Path, good: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    SHOTS.mkdir(exist_ok=True)
    d.get(url + "/")
    WebDriverWait(d, 30).until(lambda _: d.find_elements(By.CSS_SELECTOR, '[data-testid="stage-greeting"]'))
    say(d, "Hi!", "Hello! Is your pet a cat or a dog?", {"language": "en"})
    say(d, "I have a cat", "A cat! What worries you about her coat?", {"updates.pet.type": "cat"})
    say(d, "Her skin is very dry", "Dry skin needs care. What breed is she?",
        {"updates.pet.problems": ["dry_skin"]})
    d.execute_script("window.scrollTo(0, 0)")
    time.sleep(0.3)
    d.save_screenshot(str(SHOTS / "playground.png"))
    funnel.write_text(good.replace("\n  discovery:\n", "\n  discovry:\n", 1), "utf-8")
    WebDriverWait(d, 30).until(lambda _: d.find_element(By.ID, "diagnostics").is_displayed())
    d.execute_script("window.scrollTo(0, 0)")
    d.save_screenshot(str(SHOTS / "diagnostics.png"))
    funnel.write_text(good, "utf-8")
    WebDriverWait(d, 30).until(lambda _: not d.find_element(By.ID, "diagnostics").is_displayed())
    d.find_element(By.CSS_SELECTOR, '[data-testid="tab-sessions"]').click()
    WebDriverWait(d, 30).until(lambda _: d.find_elements(By.CSS_SELECTOR, "#sessions-list tr"))
    d.save_screenshot(str(SHOTS / "sessions.png"))
    sizes = [f"{p.name} {p.stat().st_size} bytes" for p in sorted(SHOTS.glob("*.png"))]
    print("screenshots:", ", ".join(sizes))


if __name__ == "__main__":
    main()
