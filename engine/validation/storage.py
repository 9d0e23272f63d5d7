"""Names that funnels validated together must not share: tables, indexes, funnels (F602-F604).

PostgreSQL keeps tables and indexes of a schema in one namespace, and the
engine creates both with ``IF NOT EXISTS``: a second funnel whose table (or
index) has a name already taken silently uses the first one's, or goes
without. So every table and index name of one `funnel validate` run must be
unique, across the funnels and within each.

The funnel's own name (`funnel:`) keys the rows of the tables all funnels
share (``funnel_messages``, ``funnel_turns``, ``funnel_outbox``) and the
session leases (``<funnel>/<session>``): two funnels of one run may not have
the same one either (F604).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from ..format.spec import index_name
from .diagnostics import Report, as_dict, as_list

Keys = tuple[str | int, ...]


class _Name(NamedTuple):
    kind: str  # "table" or "index"
    name: str
    keys: Keys  # where it is written (or, for a default index name, what makes it)
    what: str  # how a message calls it
    derived: bool = False  # a default index name, made from the table's name


@dataclass(frozen=True)
class _Owner:
    """Who took a name first: which funnel file, where, and as what."""

    kind: str  # "table", "index" or "funnel"
    file: Path
    line: int


class StorageNames:
    """The funnel, table and index names of the funnels checked so far in one run."""

    def __init__(self) -> None:
        self.taken: dict[str, _Owner] = {}
        self.funnels: dict[str, _Owner] = {}  # funnel name -> the funnel that has it
        self.files: set[Path] = set()

    def check(self, data: dict[str, Any], report: Report) -> None:
        """Report this funnel's names that an earlier one (or, for an index, itself) took."""
        if report.path.resolve() in self.files:
            return  # one file named twice on the command line (as a/f.yaml and ./a/f.yaml)
        self.files.add(report.path.resolve())
        self._check_funnel_name(data, report)
        table_taken = False
        for n in _names(data):
            line = report.located.where(n.keys)[0] if report.located else 0
            owner = self.taken.get(n.name)
            if owner is None:
                self.taken[n.name] = _Owner(n.kind, report.path, line)
                continue
            if table_taken and n.derived:
                continue  # renaming the table renames this index too
            table_taken = table_taken or n.kind == "table"
            code = "F602" if n.kind == "table" else "F603"
            report.at(n.keys, "error", code, f"{n.what} is also {_whose(owner, report)}; "
                      f"{_consequence(n.kind, owner.kind)}")

    def _check_funnel_name(self, data: dict[str, Any], report: Report) -> None:
        name = data.get("funnel")
        if not isinstance(name, str) or not name:
            return  # missing or not a string: the format layer says so (F004)
        owner = self.funnels.get(name)
        if owner is None:
            line = report.located.where(("funnel",))[0] if report.located else 0
            self.funnels[name] = _Owner("funnel", report.path, line)
            return
        report.at(("funnel",), "error", "F604",
                  f"funnel name '{name}' is also the name of the funnel {owner.file}:{owner.line}; "
                  "the engine keys the rows of its shared tables (funnel_messages, funnel_turns, "
                  "funnel_outbox) and the session leases by this name, so the two funnels would "
                  "mix their conversations: give each funnel its own `funnel:` name")


def _names(data: dict[str, Any]) -> list[_Name]:
    """A funnel's table and index names, the table first.

    Unnamed indexes get `engine.format.spec.index_name`, as the engine names them.
    """
    table = data.get("table")
    table = table if isinstance(table, str) else None
    out: list[_Name] = []
    if table:
        out.append(_Name("table", table, ("table",), f"table '{table}'"))
    for i, ix in enumerate(as_list(data.get("indexes"))):
        ix = as_dict(ix)
        name, column = ix.get("name"), ix.get("column")
        if isinstance(name, str):
            out.append(_Name("index", name, ("indexes", i, "name"), f"index name '{name}'"))
        elif table and isinstance(column, str):
            default = index_name(table, column)
            out.append(_Name("index", default, ("indexes", i),
                             f"the default name '{default}' of the index on '{column}'", True))
    for field, raw in as_dict(data.get("state")).items():
        if table and as_dict(raw).get("indexed") is True:
            default = index_name(table, field)
            out.append(_Name("index", default, ("state", field, "indexed"),
                             f"the default name '{default}' of the index of field '{field}'", True))
    return out


def _whose(owner: _Owner, report: Report) -> str:
    what = "the table" if owner.kind == "table" else "the name of an index"
    if owner.file == report.path:
        return f"{what} on line {owner.line} of this funnel"
    return f"{what} of the funnel {owner.file}:{owner.line}"


def _consequence(kind: str, other: str) -> str:
    if kind == other == "table":
        return ("the two funnels would silently share one table and mix their sessions: give "
                "each funnel its own `table:`")
    if kind == other == "index":
        return ("`CREATE INDEX IF NOT EXISTS` would silently skip this one: give it a `name:` "
                "of its own (prefix it with the funnel's name)")
    return ("PostgreSQL keeps tables and indexes in one namespace, so one of them would not "
            "be created: rename one")
