"""How long `funnel validate` takes on 100 funnels, start-up included.

Writes 100 copies of funnels/puramur.yaml (each with its own name, table and
index names; `prompts`, `catalog` and the knowledge folder made absolute so they still
point at Puramur's files) to a temporary folder, then times
``python -m engine.cli validate <folder>`` end to end, 5 runs. The floor is
``python -c "import yaml, jsonschema, jinja2"`` timed the same way: the cost of
starting Python and importing what the validator cannot do without.

Run from anywhere: ``python bench/validate_speed.py``. Target: median under 2 s.

The validator checks a template or schema text once per run however many
funnels use it (funnels in one repository share files). ``--own-files`` gives
every copy its own prompts folder, each file's text made unique:
the worst case, where nothing is shared.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The copies live in a temporary folder and read the repository's prompts: let them.
os.environ.setdefault("FUNNEL_ROOT", str(ROOT))
PURAMUR = ROOT / "funnels" / "puramur.yaml"
COPIES = 100
RUNS = 5
TARGET = 2.0


def make_funnels(folder: Path, copies: int = COPIES, *, own_files: bool = False) -> list[Path]:
    text = PURAMUR.read_text("utf-8")
    base = PURAMUR.parent

    def absolute(key: str, src: str) -> str:
        pattern = re.compile(rf"^{key}:\s*(\S+)", re.MULTILINE)
        m = pattern.search(src)
        assert m, f"no `{key}:` in {PURAMUR}"
        return pattern.sub(f"{key}: {(base / m[1]).resolve().as_posix()}", src, count=1)

    for key in ("prompts", "catalog"):  # (output contracts live in the funnel file)
        text = absolute(key, text)
    text = text.replace("{folder: puramur/knowledge", "{folder: "
                        + (base / "puramur" / "knowledge").resolve().as_posix(), 1)
    out = []
    for i in range(copies):
        name = f"puramur_{i:03d}"
        body = re.sub(r"^funnel: puramur$", f"funnel: {name}", text, count=1, flags=re.M)
        body = re.sub(r"^table: puramur_sessions_state$", f"table: {name}_sessions_state", body,
                      count=1, flags=re.M)
        body = body.replace("name: idx_sessions_", f"name: idx_{name}_")
        body = body.replace("name: idx_puramur_", f"name: idx_{name}_")
        assert f"funnel: {name}" in body and f"table: {name}_sessions_state" in body
        if own_files:
            for key in ("prompts",):
                m = re.search(rf"^{key}: (\S+)", body, re.MULTILINE)
                assert m
                own = folder / f"{name}_{key}"
                shutil.copytree(m[1], own)
                for f in own.iterdir():  # a distinct text per copy: nothing cached is reused
                    f.write_text(f.read_text("utf-8") + " " * (i + 1), "utf-8")
                body = body.replace(m[0], f"{key}: {own.as_posix()}", 1)
        path = folder / f"{name}.yaml"
        path.write_text(body, "utf-8")
        out.append(path)
    return out


def timed(cmd: list[str], runs: int = RUNS, expect_rc: int = 0) -> list[float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        times.append(time.perf_counter() - start)
        if r.returncode != expect_rc:
            sys.exit(f"{' '.join(cmd)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
    return times


def report(label: str, times: list[float]) -> None:
    print(f"{label:<44} median {statistics.median(times):6.3f} s   min {min(times):6.3f} s   "
          f"(runs: {', '.join(f'{t:.3f}' for t in times)})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--own-files", action="store_true",
                        help="give every funnel its own copy of the prompts")
    parser.add_argument("--smoke", action="store_true",
                        help="the smallest run (tests/test_bench_smoke.py): 3 funnels, 1 run")
    args = parser.parse_args()
    runs = 1 if args.smoke else RUNS
    with tempfile.TemporaryDirectory(prefix="funnel-bench-") as tmp:
        folder = Path(tmp)
        files = make_funnels(folder, 3 if args.smoke else COPIES, own_files=args.own_files)
        check = subprocess.run([sys.executable, "-m", "engine.cli", "validate", str(folder)],
                               cwd=ROOT, capture_output=True, text=True)
        if check.returncode != 0 or check.stdout:
            sys.exit(f"the generated funnels do not validate cleanly:\n{check.stdout}"
                     f"{check.stderr}")
        shared = "own prompts each" if args.own_files else "sharing puramur's files"
        print(f"{len(files)} funnels ({shared}) in {folder} ({sys.executable}, Python "
              f"{sys.version.split()[0]})")
        floor = timed([sys.executable, "-c", "import yaml, jsonschema, jinja2"], runs)
        report('floor: python -c "import yaml, jsonschema, jinja2"', floor)
        one = timed([sys.executable, "-m", "engine.cli", "validate", str(files[0])], runs)
        report("funnel validate <1 funnel>", one)
        full = timed([sys.executable, "-m", "engine.cli", "validate", str(folder)], runs)
        report(f"funnel validate <folder of {len(files)}>", full)
    median = statistics.median(full)
    per = (median - statistics.median(one)) / (len(files) - 1) * 1000
    print(f"per extra funnel: {per:.1f} ms; over the import floor: "
          f"{median - statistics.median(floor):.3f} s")
    verdict = "OK" if median < TARGET else "TOO SLOW"
    print(f"target: median under {TARGET:.1f} s -> {verdict}")
    return 0 if median < TARGET or args.smoke else 1  # a smoke run measures nothing


if __name__ == "__main__":
    sys.exit(main())
