"""What versions cost (docs/versions.md): compiling an old version from its stored bundle,
and choosing a session's version in every turn.

1. Puramur compiled from its stored bundle (`engine.versions.bundle.compile_bundle`:
   files written to a temporary folder, validated, compiled), against the baseline
   measured in the same run: `load_funnel` on the repository's files. Paid once per old
   version and process, when its first pinned session comes back.
2. The per-turn seam (`Versions.choose` + `Versions.move`) for a session on the newest
   version, one pinned to an old one, and one moving with a rename migration, against
   the baseline of an empty loop over the same rows.

Run: ``python bench/versions.py [--smoke]``. No database needed.
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

from engine.format.settings import MigrationStep
from engine.funnel.compiled import load_funnel
from engine.store import Store
from engine.versions.bundle import LoadedVersion, bundle_of, compile_bundle
from engine.versions.pinning import Versions

ROOT = Path(__file__).resolve().parent.parent
PURAMUR = ROOT / "funnels" / "puramur.yaml"


def timed(fn: Any, runs: int) -> float:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    # `--smoke`: the smallest run (tests/test_bench_smoke.py), every step once or so.
    smoke = "--smoke" in sys.argv[1:]
    runs, n = (1, 100) if smoke else (10, 100_000)
    funnel = load_funnel(PURAMUR)
    bundle = bundle_of(funnel.spec)
    print(f"bundle: {len(bundle.files)} files, "
          f"{sum(len(t) for t in bundle.files.values()) / 1024:.0f} KiB, {bundle.digest[:12]}")
    base = timed(lambda: load_funnel(PURAMUR), runs)

    def from_store() -> None:
        loaded = compile_bundle(bundle)
        assert loaded.folder is not None
        loaded.folder.cleanup()

    stored = timed(from_store, runs)
    print(f"compile: load_funnel from files (baseline) {base * 1000:.1f} ms, "
          f"from the stored bundle {stored * 1000:.1f} ms (x{stored / base:.2f}), median of "
          f"{runs}")

    # The per-turn seam. v2 is Puramur with a rename migration; v1 is Puramur itself.
    v2 = load_funnel(PURAMUR)
    v2.spec = replace(v2.spec, version=2, migrations=(
        MigrationStep(1, 2, rename=(("pet", "pet_profile"),)),))
    versions = Versions(v2, cast(Store, None))
    versions._keep(1, LoadedVersion(funnel, bundle.digest))  # noqa: SLF001 - bench set-up
    now = datetime.now(UTC)
    row = {"session_id": "s", "stage": "discovery", "pet": {"type": "cat"},
           "last_message_at": now.isoformat()}
    newest, pinned = {**row, "funnel_version": 2}, {**row, "funnel_version": 1}

    def loop(r: dict[str, Any], work: bool) -> float:
        start = time.perf_counter()
        for _ in range(n):
            if work:
                chosen = versions.choose(r, now)
                versions.move("s", r, chosen)
        return (time.perf_counter() - start) / n * 1e6

    empty = loop(newest, False)
    print(f"per turn (µs, {n} turns): empty loop {empty:.2f}, newest {loop(newest, True):.2f}, "
          f"pinned to v1 {loop(pinned, True):.2f}")
    v2.spec = replace(v2.spec, pin=False)
    print(f"moving v1 -> v2 with a rename (pin: false): {loop(pinned, True):.2f} µs per turn")


if __name__ == "__main__":
    main()
