"""Issue 29's authoring-mistake classes, black-box through `funnel validate`, on any checkout.

Each case is a folder of tests/corpus with one mistake a careless author makes (a pattern
RE2 cannot run, a `.nan` price, a template reading a product field no product has, a
standard-library hook, `grounded:` on what holds no text, a `confirm:` that guards
nothing). Each line of a case's `expected.txt` is one mistake tried; it *survives* when
the engine under test reports it, with that code at that line, so that the author hears of
it before the funnel ships. Run it against an older checkout to measure "before"::

    python bench/hardening_classes.py                      # this checkout
    python bench/hardening_classes.py --engine /path/to/old/checkout

The engine is run as ``python -m engine.cli validate CASE --format json`` with the
checkout first on ``PYTHONPATH``; the corpus is always this checkout's. Prints tried and
survived per class, then the total. Classes that need `funnel serve` (Telegram updates,
idempotency keys, a half-sent head, a gzip bomb, shutdown) are in the tests, not here.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "corpus"

CLASSES = {
    "ReDoS patterns (state field, output schema)": ["f309_nonlinear_pattern"],
    "catalog .nan/.inf prices, unknown product field": [
        "f502_catalog_price_nan", "f502_catalog_price_inf", "f211_unknown_product_field"],
    "hooks naming the standard library": ["f506_stdlib_hook"],
    "grounded: on what holds no text, or not personal": ["f310_grounded_not_text"],
    "confirm: that guards nothing": ["f507_confirm_guards_nothing"],
}


def expected(case: Path) -> set[tuple[str, str, int]]:
    out = set()
    for line in (case / "expected.txt").read_text("utf-8").splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            code, where = line.split(" ", 1)
            file, _, number = where.rpartition(":")
            out.add((code, file, int(number)))
    return out


def reported(engine: Path, case: Path) -> set[tuple[str, str, int]]:
    env = {**os.environ, "PYTHONPATH": str(engine)}
    done = subprocess.run([sys.executable, "-m", "engine.cli", "validate", str(case),
                           "--format", "json"], cwd=engine, env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    try:
        found = json.loads(done.stdout or "[]")
    except json.JSONDecodeError:
        return set()
    return {(d["code"], os.path.relpath(d["file"], case), int(d["line"])) for d in found}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", type=Path, default=ROOT,
                        help="the checkout whose engine validates (default: this one)")
    parser.add_argument("--smoke", action="store_true",
                        help="the smallest run (tests/test_bench_smoke.py): the first class")
    args = parser.parse_args()
    total_tried = total_survived = 0
    print(f"engine: {args.engine}")
    for name, cases in list(CLASSES.items())[:1] if args.smoke else CLASSES.items():
        tried = survived = 0
        for case in cases:
            want = expected(CORPUS / case)
            got = reported(args.engine.resolve(), CORPUS / case)
            tried += len(want)
            survived += len(want & got)
        total_tried += tried
        total_survived += survived
        print(f"{name}: tried {tried}, survived {survived}")
    print(f"total: tried {total_tried}, survived {total_survived}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
