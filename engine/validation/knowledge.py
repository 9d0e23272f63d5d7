"""Checks of the ``language:`` policy and the ``knowledge:`` base (F701-F703).

Importing this module loads no language model: a code is checked against the
detector's list of ISO 639-1 codes only.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from lingua import IsoCode639_1

from ..errors import did_you_mean
from ..format.paths import funnel_roots, is_confined
from .diagnostics import Report, as_dict, as_list

LANGUAGE_CODES = sorted(c.lower() for c in dir(IsoCode639_1) if c.isupper() and len(c) == 2)


def check_language(data: dict[str, Any], report: Report) -> None:
    """F701: every language code is one the detector knows; ``default`` is a declared one."""
    lang = as_dict(data.get("language"))
    codes: list[tuple[tuple[str | int, ...], Any]] = [(("language", "fixed"), lang.get("fixed")),
                                                     (("language", "default"), lang.get("default"))]
    codes += [(("language", "follow_customer", i), c)
              for i, c in enumerate(as_list(lang.get("follow_customer")))]
    for keys, code in codes:
        if isinstance(code, str) and code not in LANGUAGE_CODES:
            report.at(keys, "error", "F701", f"language {code!r} is not an ISO 639-1 code the "
                      f"detector knows{did_you_mean(code, LANGUAGE_CODES)}")
    follow = [c for c in as_list(lang.get("follow_customer")) if isinstance(c, str)]
    default = lang.get("default")
    if isinstance(default, str) and follow and default not in follow:
        report.at(("language", "default"), "error", "F701", f"`default: {default}` is not one "
                  f"of `follow_customer` ({', '.join(follow)}); add it there or pick one of them")
    if isinstance(default, str) and not follow:
        report.at(("language", "default"), "error", "F701", "`default` applies to "
                  "`follow_customer` only; declare `follow_customer: [...]` or use `fixed:`")
    if (lang.get("fixed") or follow) and not lang.get("response"):
        report.at(("language",), "error", "F701", "a language policy needs `response:`, the "
                  "state field that keeps the language of the replies", key=True)


def knowledge_folder(data: dict[str, Any], funnel_path: Path) -> tuple[Path | None, str]:
    """The knowledge folder a funnel names, resolved, or (None, why not).

    Confined like every file a funnel reads (`engine.format.paths`): inside the funnel's
    project or a folder the operator lists in ``FUNNEL_ROOT``, never a hidden one.
    """
    raw = data.get("knowledge")
    folder = raw if isinstance(raw, str) else as_dict(raw).get("folder")
    if not isinstance(folder, str):
        return None, ""
    path = Path(os.path.normpath(funnel_path.parent / folder))
    roots = funnel_roots(funnel_path)
    if not is_confined(path, roots):
        return None, (f"knowledge folder {folder!r} is outside the funnel's folder "
                      f"({', '.join(map(str, roots))}) or hidden; a funnel may only read "
                      "visible files inside its own project")
    if not path.is_dir():
        return None, f"knowledge folder {path} does not exist; create it or fix `knowledge:`"
    return path, ""


def check_knowledge(data: dict[str, Any], report: Report) -> None:
    """F702: the folder exists inside the funnel's project and holds Markdown files;
    F703: a stage asks for knowledge the funnel does not have."""
    keys: tuple[str, ...] = ("knowledge",) if isinstance(data.get("knowledge"), str) \
        else ("knowledge", "folder")
    path, problem = knowledge_folder(data, report.path)
    if problem:
        report.at(keys, "error", "F702", problem)
    elif path is not None and not any(path.rglob("*.md")):
        report.at(keys, "warning", "F702", f"knowledge folder {path} has no *.md files: "
                  "stages that ask for knowledge will get none")
    if data.get("knowledge"):
        return
    for name, stage in as_dict(data.get("stages")).items():
        if as_dict(stage).get("knowledge") is not None:
            report.at(("stages", name, "knowledge"), "error", "F703", f"stage '{name}' asks for "
                      "knowledge but the funnel declares no `knowledge:` folder; add one or "
                      "remove the stage's `knowledge:`", key=True)
