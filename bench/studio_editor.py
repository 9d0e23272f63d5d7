"""The studio editor's figures (docs/studio.md#make-and-change-a-funnel, issue 39 §2).

- page weight: the bytes of every asset the page loads (its HTML and each ``<script>`` and
  stylesheet it names), raw and gzipped, as it opens, once the Editor tab has loaded
  CodeMirror 5, and, as the baseline in the same run, the page before the editor;
- as typed -> diagnostic: ``POST /api/editor/lint`` of a funnel file with a mistake, until
  its diagnostics are back (the page waits 300 ms after the last key first), beside the
  baseline of the validator alone on the same text (``engine.validation.check_text``);
- save -> diagnostic: ``POST /api/editor/save`` of a broken funnel file, until the answer
  carries the watcher's verdict (the studio polls files every 0.25 s and waits one more
  look for a save to settle), and of the fixed file, until it is reloaded.

Run: ``PYTHONPATH=. python bench/studio_editor.py [--db URL] [--n 20]``.
"""

from __future__ import annotations

import argparse
import gzip
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from bench._db import server_url, throwaway_schema  # noqa: E402
from bench.studio import serving  # noqa: E402
from engine.authoring.scaffold import scaffold  # noqa: E402
from engine.studio import Studio, create_studio_app  # noqa: E402
from engine.studio.app import ASSETS, STATIC  # noqa: E402
from engine.validation import check_text  # noqa: E402

BASE = ("studio.html", "studio.js", "form.js", "studio.css")  # the page less editor.js, CodeMirror


def page_weight() -> None:
    html = (STATIC / "studio.html").read_text("utf-8")
    first = ["studio.html", *re.findall(r'(?:src|href)="static/([^"]+)"', html)]
    vendor = [name for name in ASSETS if name.startswith("vendor/")]  # the Editor tab's
    for label, files in (("the page as it opens", first),
                         ("the page with the Editor tab opened", first + vendor),
                         ("the page without the editor's files (baseline)", list(BASE))):
        raw = sum((STATIC / f).stat().st_size for f in files)
        packed = sum(len(gzip.compress((STATIC / f).read_bytes())) for f in files)
        print(f"page weight, {label}: {raw} bytes ({packed} gzipped) in {len(files)} files")


def ms(values: list[float]) -> str:
    values = sorted(values)
    return (f"median {statistics.median(values):.0f} ms, p90 "
            f"{values[int(0.9 * (len(values) - 1))]:.0f} ms ({len(values)} runs)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db")
    parser.add_argument("--n", type=int, default=20)
    args = parser.parse_args()
    page_weight()
    project = Path(tempfile.mkdtemp()) / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text("")
    scaffold("shop", project / "shop")
    path = project / "shop" / "funnel.yaml"
    good = path.read_text("utf-8")
    bad = good.replace("initial: greeting", "initial: greting")
    with throwaway_schema(server_url(args.db)) as db:
        async def opened() -> Studio:
            return await Studio.open([path], db=db)

        with serving(create_studio_app(opened)) as url, httpx.Client(base_url=url, timeout=60) as h:
            alone, linted = [], []
            for _ in range(args.n):
                t = time.perf_counter()
                assert check_text(path, bad)[1]
                alone.append((time.perf_counter() - t) * 1000)
                t = time.perf_counter()
                r = h.post("/api/editor/lint", json={"funnel": "shop", "file": "funnel.yaml",
                                                     "text": bad})
                assert r.json()["diagnostics"], r.text
                linted.append((time.perf_counter() - t) * 1000)
            print(f"validator alone on the funnel file (baseline): {ms(alone)}")
            print(f"as typed -> diagnostic (POST /api/editor/lint): {ms(linted)}; "
                  "the page sends it 300 ms after the last key")
            broken, fixed = [], []
            base = h.get("/api/editor/file", params={"funnel": "shop", "file": "funnel.yaml"}
                         ).json()["hash"]
            for _ in range(max(3, args.n // 4)):
                for text, out, ok in ((bad, broken, False), (good, fixed, True)):
                    t = time.perf_counter()
                    r = h.post("/api/editor/save", json={"funnel": "shop", "file": "funnel.yaml",
                                                         "text": text, "base": base}).json()
                    out.append((time.perf_counter() - t) * 1000)
                    assert r["saved"] and r["status"]["ok"] is ok, r
                    base = r["hash"]
            print(f"save -> diagnostics on the page (a broken save): {ms(broken)}")
            print(f"save -> reloaded (the fixed save): {ms(fixed)}")


if __name__ == "__main__":
    main()
