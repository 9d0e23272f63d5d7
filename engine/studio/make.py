"""Make a funnel in the page, and migrate its table when an edit needs it.

- :func:`new_funnel` writes what `funnel new` writes (engine.authoring.scaffold), with
  the language and currency chosen, into the studio's workspace (beside the first
  funnel it shows, inside that funnel's project), and opens it in the studio.
- :func:`migration` shows the DDL an edit needs (a new state field: a new column), and
  :func:`migrate` runs it (what `funnel migrate` runs, engine.store.migrate) and takes the
  funnel at once through the watcher's own reload, without another save.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
from pathlib import Path
from typing import Any

from psycopg import sql as pgsql

from ..authoring.scaffold import TEMPLATES, funnel_name, scaffold
from ..errors import ConfigError, FunnelError, FunnelInvalid, InvalidInput
from ..format.paths import funnel_roots, is_confined
from ..format.spec import FunnelSpec
from ..funnel.compiled import CompiledFunnel, load_funnel
from ..store import ddl
from .playground import Studio

__all__ = ["identifier", "migrate", "migration", "new_funnel", "workspace"]



def identifier(name: str) -> str:
    """``name`` as a funnel name: ``pet-shop`` -> ``pet_shop``.

    Raises:
        InvalidInput: what is left is not a funnel name (the rule is in the message).
    """
    try:
        return funnel_name(name)  # the one rule `funnel new` follows too
    except ConfigError as exc:
        raise InvalidInput(str(exc)) from None


def workspace(studio: Studio) -> Path:
    """Where the page's new funnels go: the studio's home folder when it has one, else
    beside the first funnel the studio shows (the folder holding a `funnel new` folder,
    else the funnel file's folder), inside its project."""
    if studio.home is not None:  # `funnel studio DIR` (or no argument: the current folder)
        return studio.home
    first = Path(os.path.realpath(_first(studio)))
    folder = first.parent.parent if first.stem == "funnel" else first.parent
    root = funnel_roots(first)[0]
    return folder if folder.is_relative_to(root) else root


def _roots(studio: Studio) -> tuple[Path, ...]:
    """The project(s) the page may write a new funnel into."""
    if studio.home is not None:
        return funnel_roots(studio.home / "funnel.yaml")  # the home's own project
    return funnel_roots(_first(studio))


def _first(studio: Studio) -> Path:
    """The first funnel file the studio shows, running or not (engine.studio.broken)."""
    paths = [w.path for w in studio.watched.values()] + [b.path for b in studio.broken.values()]
    return paths[0]


def _localize(folder: Path, language: str, currency: str) -> None:
    """The chosen language and currency in the scaffolded files."""
    path = folder / "funnel.yaml"
    text = path.read_text("utf-8")
    if re.search(r"^language:", text, flags=re.M):
        # A copied template follows the customer's language: the chosen one until known.
        text = re.sub(r"^(language:\n(?:[ #].*\n)*?  default:) *[a-z]{2}", rf"\1 {language}",
                      text, count=1, flags=re.M)
    else:  # the minimal one's texts and scenarios are English: the model decides, from it
        text = text.replace("\nstate:\n", "\nlanguage:\n  response: response_language  # "
                            f"docs/language.md; the replies start in {language}\n\nstate:\n"
                            f"  response_language: {{type: string, default: {language}, "
                            "nullable: true}\n", 1)
    path.write_text(text, "utf-8")
    catalog = folder / "catalog.yaml"
    if catalog.is_file():
        ctext = catalog.read_text("utf-8")
        catalog.write_text(re.sub(r"^currency: *\S+", f"currency: {currency}", ctext,
                                  count=1, flags=re.M), "utf-8")


async def new_funnel(studio: Studio, name: str, language: str, currency: str,
                     template: str) -> dict[str, Any]:
    """Write a new funnel folder and open it in the studio.

    ``template``: one of `funnel new`'s (``minimal``, ``puramur``, ``b2b_demo``) or
    ``minimal+catalog`` (the minimal one with a catalog, where the currency goes).

    Raises:
        InvalidInput: a bad name, template, or a funnel or folder of that name exists.
    """
    ident = identifier(name)
    base, catalog = template.partition("+")[::2]
    if base not in TEMPLATES or catalog not in ("", "catalog") or (catalog and base != "minimal"):
        raise InvalidInput(f"`template`: {template!r}; choose one of "
                           f"{', '.join(TEMPLATES)}, minimal+catalog")
    if ident in studio.engines or ident in studio.broken:
        raise InvalidInput(f"the studio has a funnel '{ident}' already; choose another name")
    root = workspace(studio)
    folder = root / ident
    if not is_confined(folder, _roots(studio)):
        raise InvalidInput(f"{folder} is outside the project; the studio writes inside it only")
    if folder.exists():
        raise InvalidInput(f"{folder} exists already; choose another name (nothing written)")

    def write() -> list[Path]:
        files = scaffold(ident, folder, base, catalog=bool(catalog))
        _localize(folder, language, currency)
        return files

    try:
        files = await asyncio.to_thread(write)
    except FunnelError as exc:
        raise InvalidInput(str(exc)) from None
    try:
        await studio.add(folder / "funnel.yaml")
    except FunnelError as exc:  # nothing half-made is left behind
        await asyncio.to_thread(shutil.rmtree, folder, True)
        raise InvalidInput(f"the new funnel could not be opened: {exc}") from None
    return {"funnel": ident, "path": str(folder / "funnel.yaml"),
            "files": [os.path.relpath(p, folder) for p in files]}


def _ddl_text(spec: FunnelSpec, missing: list[str]) -> list[str]:
    """The statements that add the columns (as engine.store.migrate runs them), as text:
    quoted without a connection (UTF-8, standard strings), for reading."""
    table = pgsql.Identifier(spec.table)
    return [pgsql.SQL("ALTER TABLE {} ADD COLUMN {}").format(table, definition)
            .as_string(None) + ";"
            for name, definition in ddl.column_defs(spec) if name in missing]


async def _on_disk(studio: Studio, name: str) -> tuple[CompiledFunnel, Any]:
    """The funnel's file as saved, and what watches it (its watcher, or the held funnel
    that has not run yet: engine.studio.broken)."""
    watched: Any = studio.watched.get(name) or studio.broken.get(name)
    if watched is None:
        studio.engine(name)  # raises: no such funnel
        raise AssertionError  # pragma: no cover
    try:
        return await asyncio.to_thread(load_funnel, watched.path), watched
    except FunnelInvalid as exc:
        raise InvalidInput(f"the funnel's file has problems ({len(exc.diagnostics)}); fix "
                           "them and save before migrating") from None


async def migration(studio: Studio, name: str) -> dict[str, Any]:
    """What `funnel migrate --check` would do for the funnel as saved: the DDL of each new
    column, and every change in words (``would add column pet_age``...)."""
    try:
        funnel, _ = await _on_disk(studio, name)
    except InvalidInput as exc:  # the file has problems: they come first (not a refusal)
        if name not in studio.watched and name not in studio.broken:
            raise
        return {"funnel": name, "needed": False, "blocked": str(exc)}
    missing, _extra = await studio.store.check_schema(funnel.spec)
    changes = await studio.store.migrate(funnel.spec, check=True)
    return {"funnel": name, "table": funnel.spec.table, "needed": bool(missing),
            "ddl": _ddl_text(funnel.spec, missing),
            "changes": [c for c in changes if " view " not in c and " function " not in c]}


async def migrate(studio: Studio, name: str) -> dict[str, Any]:
    """Run the migration (engine.store.migrate, as `funnel migrate`), then take the funnel
    through the watcher's reload: the page runs the new version with no other save.
    The version store is left alone: the studio never changes what production runs."""
    funnel, watched = await _on_disk(studio, name)
    changes = await studio.store.migrate(funnel.spec)
    errors = [c for c in changes if c.startswith("error:")]
    if errors:
        raise InvalidInput("; ".join(errors))
    if name in studio.broken:  # held until its table caught up: it opens now
        await watched.check()
        name = watched.promoted_as or name
        watched = studio.watched.get(name, watched)
    else:
        await watched.reload()
    return {"funnel": name, "changes": changes, "status": watched.status()}
