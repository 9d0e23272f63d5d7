"""A copy of Puramur in a project of its own, for tests and benches that edit its files."""

from __future__ import annotations

import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def copy_puramur(root: Path) -> Path:
    """Copy Puramur's funnel file, prompts, catalog and knowledge folder under
    ``root`` (a ``pyproject.toml`` marks it a project root); return the funnel file."""
    (root / "funnels" / "puramur").mkdir(parents=True)
    (root / "pyproject.toml").write_text("")
    shutil.copy(ROOT / "funnels" / "puramur.yaml", root / "funnels" / "puramur.yaml")
    shutil.copy(ROOT / "funnels" / "puramur" / "catalog.yaml", root / "funnels" / "puramur")
    shutil.copytree(ROOT / "funnels" / "puramur" / "knowledge",
                    root / "funnels" / "puramur" / "knowledge")
    shutil.copytree(ROOT / "prompts" / "puramur", root / "prompts" / "puramur")
    return root / "funnels" / "puramur.yaml"
