"""The advisor's replay of a suggested threshold (engine.evidence.advise): the funnel
with the threshold substituted, in a temporary copy of its files (its version bundle),
played over recorded sessions by `funnel replay`'s own entry point."""

from __future__ import annotations

import re
from typing import Any, Protocol

from ..funnel.compiled import CompiledFunnel
from ..versions.bundle import Bundle, bundle_of, compile_bundle
from .copies import copies_from
from .records import read_bundle, read_copy
from .replay import replay

__all__ = ["replay_threshold"]


class Threshold(Protocol):
    """What the replay reads of engine.evidence.advise's threshold (a protocol, not an
    import: advise imports this module)."""

    @property
    def field(self) -> str: ...
    @property
    def op(self) -> str: ...
    @property
    def value(self) -> float: ...
    @property
    def text(self) -> str: ...
    @property
    def line(self) -> int: ...


def replay_threshold(funnel: CompiledFunnel, db: str | None, t: Threshold, value: float,
            population: Any, recorded: int, replay_cap: int) -> dict[str, Any]:
    """The funnel with ``t`` set to ``value`` (a temporary copy of its files), replayed."""
    new = f"{t.field} {t.op} {num(value)}"
    out: dict[str, Any] = {"condition": new, "sessions": len(population.sessions),
                           "of": recorded, "capped": replay_cap < recorded}
    if not population.sessions:  # nothing recorded to replay (and no detector to warm)
        out.update({k: 0 for k in ("same", "different", "needs_model", "not_reproduced",
                                   "skipped", "changed")})
        out["reach"] = {}
        return out
    bundle = bundle_of(funnel.spec)
    edited = _substitute(bundle, funnel, t, new)
    if edited is None:
        out["error"] = (f"`{t.text}` is not on line {t.line} of the funnel file or the lines "
                        "after it; edit it by hand and run `funnel replay`")
        return out
    loaded = compile_bundle(edited)
    versions: list[Any] = []

    def base(version: int) -> CompiledFunnel | str:
        found = read_bundle(db, funnel.name, version)
        if found is None:
            return funnel
        v = compile_bundle(Bundle(funnel.name, version, found[1], found[2], found[0]))
        versions.append(v)
        return v.funnel

    # Each session on the copy its turns ran on, as `funnel replay` plays it (issue 44).
    copy, _ = copies_from(lambda v, h: read_copy(db, funnel.name, v, h), funnel.name,
                          versions)
    try:
        result = replay(loaded.funnel, population, base, copy=copy)
    finally:
        for v in [loaded, *versions]:
            if v.folder is not None:
                v.folder.cleanup()
    counts = result.counts()
    out.update(counts)
    out["reach"] = {name[6:]: list(ba) for name, ba in result.metrics().items()
                    if name.startswith("reach.")}
    return out


def _substitute(bundle: Bundle, funnel: CompiledFunnel, t: Threshold, new: str
                ) -> Bundle | None:
    """The bundle with the threshold's text replaced on its exit's lines (its `- to:`
    line and the three after it) of the funnel file."""
    text = bundle.files[bundle.entry]
    lines = text.split("\n")
    pattern = re.compile(rf"(?<![\w.]){re.escape(t.field)}\s*{re.escape(t.op)}\s*"
                         rf"{re.escape(num(t.value))}(?![\w.])")
    for i in range(max(0, t.line - 1), min(len(lines), t.line + 3)):
        if pattern.search(lines[i]):
            lines[i] = pattern.sub(new, lines[i], count=1)
            files = {**bundle.files, bundle.entry: "\n".join(lines)}
            return Bundle(bundle.name, bundle.version, bundle.entry, files, "")
    return None


def num(value: float) -> str:
    """A threshold as a funnel file writes it (``60``, ``0.5``)."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"
