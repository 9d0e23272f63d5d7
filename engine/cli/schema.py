"""`funnel schema`: a funnel's stage output contracts, as the turn uses them.

Printed as JSON (one stage with ``--stage``, else ``{stage: contract}``), or with
``--write`` written to the funnel's ``schemas`` folder as ``<stage>.json``, for a
team that wants the contracts in review. The funnel stays the source: a derived
stage does not read the written file (``schema:`` makes a stage read one).
"""

from __future__ import annotations

import argparse
import json
import sys

from ..errors import ConfigError, did_you_mean
from ..funnel.compiled import load_funnel


def cmd_schema(args: argparse.Namespace) -> int:
    funnel = load_funnel(args.funnel)
    names = list(funnel.stages)
    if args.stage is not None and args.stage not in funnel.stages:
        raise ConfigError(f"funnel '{funnel.name}' has no stage '{args.stage}'"
                          f"{did_you_mean(args.stage, names)}; its stages: {', '.join(names)}")
    chosen = [args.stage] if args.stage else names
    if not args.write:
        out = (funnel.stages[chosen[0]].schema if args.stage
               else {n: funnel.stages[n].schema for n in chosen})
        print(json.dumps(out, indent=2, ensure_ascii=False))
        return 0
    folder = funnel.spec.schemas_dir
    if folder is None:  # pragma: no cover - build_spec always sets it
        raise ConfigError("the funnel names no schemas folder")
    folder.mkdir(parents=True, exist_ok=True)
    for name in chosen:
        stage = funnel.stages[name]
        if not stage.spec.derived:
            print(f"{name}: hand-written ({stage.spec.schema}), left as it is", file=sys.stderr)
            continue
        path = folder / f"{name}.json"
        path.write_text(json.dumps(stage.schema, indent=2, ensure_ascii=False) + "\n", "utf-8")
        print(f"wrote {path}")
    return 0
