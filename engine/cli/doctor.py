"""`funnel doctor`: probe a model endpoint (docs/models.md)."""

from __future__ import annotations

import argparse
import asyncio
import sys

from ..funnel.compiled import load_funnel
from ..llm.doctor import diagnose, healthy, render


def cmd_doctor(args: argparse.Namespace) -> int:
    funnel = load_funnel(args.funnel)
    model = args.model or funnel.spec.model.name
    if model.startswith("scripted"):
        print("funnel: error: the scripted model has no endpoint to probe; give --model",
              file=sys.stderr)
        return 2
    report = asyncio.run(diagnose(funnel, model, api_base=args.api_base,
                                  structured_output=args.structured_output))
    sys.stdout.write(render(report))
    return 0 if healthy(report) else 1
