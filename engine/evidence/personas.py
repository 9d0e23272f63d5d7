"""The simulated customers of `funnel simulate`: a personas file, read strictly.

::

    personas:
      - name: sphynx_owner            # [a-z0-9_], unique
        who: Anna, owns a Sphynx cat, buys online, in a hurry
        wants: something for her cat's dry skin, under 1000 UAH
        knows: {pet: Sphynx cat, age: 3, name: Anna, phone: "066 123 45 67"}
        language: en
        patience: 8                   # turns before they leave (1-50)
        objections: ["Isn't that expensive?"]
        leaves_when: "the price is over 1500 UAH"   # for a model-played customer
        weight: 2                     # how often the persona comes (default 1)
        script:                       # the scripted customer: these messages, in order
          - Hi!
          - I have a Sphynx cat with very dry skin
          - ~                         # silent: waits for the funnel's follow-up (if any)
          - Yes, let's order

A persona with a ``script`` is played by the script (deterministic: for CI); without
one, or with ``--customer-model``, by a model that is given the persona (never the
funnel's replies as instructions). Every problem names the file, the persona and the
field, and what was expected. The file crosses a trust boundary like a funnel file, and is
read with the same guard (engine.format._yaml: aliases, nesting, duplicate keys), bounded
in bytes before it is read; each refusal is one line with the file and, when known, the
line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..format import _yaml

__all__ = ["Persona", "load_personas"]

_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
_TEXT_FIELDS = ("who", "wants", "language", "leaves_when")
_KNOWN = {"name", "who", "wants", "knows", "language", "patience", "objections",
          "leaves_when", "weight", "script"}
MAX_PERSONAS = 200
MAX_TEXT = 1000
# 200 personas of 50 full-length messages each fit in 11 MB: a bigger file is a mistake
# (or /dev/zero), refused before it is read whole.
MAX_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class Persona:
    """One kind of customer."""

    name: str
    who: str = ""
    wants: str = ""
    knows: dict[str, Any] = field(default_factory=dict)
    language: str = "en"
    patience: int = 10
    objections: tuple[str, ...] = ()
    leaves_when: str = ""
    weight: int = 1
    # None: the customer says nothing there, until a follow-up (docs/follow-ups.md).
    script: tuple[str | None, ...] = ()

    def brief(self) -> str:
        """The persona as the customer model is told it (operator-written text)."""
        knows = "; ".join(f"{k}: {v}" for k, v in self.knows.items()) or "nothing in particular"
        parts = [f"You are a customer talking to a shop's sales assistant in a chat. Who you "
                 f"are: {self.who or 'a customer'}.", f"What you want: {self.wants or 'to buy'}.",
                 f"What you know and tell when asked: {knows}.",
                 f"Write in the language with code {self.language}, in short chat messages."]
        if self.objections:
            parts.append("Raise these doubts when products are offered: "
                         + "; ".join(self.objections) + ".")
        if self.leaves_when:
            parts.append(f"You leave the conversation when {self.leaves_when}.")
        parts.append('Answer with one JSON object: {"message": "what you write", "leave": '
                     'false}; set "leave" to true (and "message" to a goodbye) when you leave.')
        return " ".join(parts)


def load_personas(path: str | Path) -> list[Persona]:
    """Read and check a personas file.

    Raises:
        ConfigError: the file cannot be read, or a persona is malformed.
    """
    path = Path(path)
    data = _read(path)
    raw = data.get("personas") if isinstance(data, dict) else None
    if not isinstance(raw, list) or not raw:
        raise ConfigError("expected a mapping with `personas:`, a list of personas "
                          "(docs/evidence.md)", file=str(path))
    if len(raw) > MAX_PERSONAS:
        raise ConfigError(f"at most {MAX_PERSONAS} personas; got {len(raw)}", file=str(path))
    out: list[Persona] = []
    for i, item in enumerate(raw):
        out.append(_persona(item, f"personas[{i}]", path))
    names = [p.name for p in out]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"persona names must be unique; repeated: {', '.join(dupes)}",
                          file=str(path))
    return out


def _read(path: Path) -> Any:
    """The file's YAML, through the guard every loader of the engine uses
    (engine.format._yaml: aliases, nesting, duplicate keys), bounded in bytes first."""
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read the personas file: {exc.strerror or exc}",
                          file=str(path)) from None
    if len(raw) > MAX_BYTES:
        raise ConfigError(f"the personas file is larger than {MAX_BYTES // (1024 * 1024)} MB; "
                          "a personas file is a few kilobytes of YAML", file=str(path))
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise ConfigError("the personas file is not UTF-8 text (a binary file?); it must be "
                          "YAML (docs/evidence.md)", file=str(path), line=line) from None
    if "\x00" in text:
        raise ConfigError("the personas file holds NUL bytes (a binary file?); it must be "
                          "YAML (docs/evidence.md)", file=str(path),
                          line=text[:text.index("\x00")].count("\n") + 1)
    try:
        located = _yaml.load(text)
    except _yaml.YamlSyntaxError as exc:
        raise ConfigError(str(exc).replace("a funnel needs", "a personas file needs"),
                          file=str(path), line=exc.line) from None
    if located.duplicates:
        keys, line, _col, first = located.duplicates[0]
        raise ConfigError(f"duplicate key '{keys[-1]}' (first on line {first}); remove or "
                          "rename one", file=str(path), line=line)
    return located.data


def _persona(item: Any, where: str, path: Path) -> Persona:
    def bad(message: str) -> ConfigError:
        return ConfigError(f"{where}: {message}", file=str(path))

    if not isinstance(item, dict):
        raise bad("expected a mapping with at least `name`")
    unknown = sorted(set(item) - _KNOWN)
    if unknown:
        raise bad(f"unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(_KNOWN))}")
    name = item.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise bad("`name` must be lowercase letters, digits and _ (e.g. sphynx_owner)")
    where = f"persona {name}"
    for key in _TEXT_FIELDS:
        value = item.get(key, "")
        if not isinstance(value, str) or len(value) > MAX_TEXT:
            raise bad(f"`{key}` must be text of at most {MAX_TEXT} characters")
    knows = item.get("knows") or {}
    if not isinstance(knows, dict) or not all(isinstance(k, str) for k in knows):
        raise bad("`knows` must be a mapping of what the customer knows (name: Anna)")
    patience = item.get("patience", 10)
    if isinstance(patience, bool) or not isinstance(patience, int) or not 1 <= patience <= 50:
        raise bad(f"`patience` must be a whole number of turns from 1 to 50; got {patience!r}")
    weight = item.get("weight", 1)
    if isinstance(weight, bool) or not isinstance(weight, int) or not 1 <= weight <= 100:
        raise bad(f"`weight` must be a whole number from 1 to 100; got {weight!r}")
    lists: dict[str, tuple[Any, ...]] = {}
    for key in ("objections", "script"):
        value = item.get(key) or []
        # A script's `~` (null): the customer is silent there (a follow-up may come).
        silent_ok = key == "script"
        if not isinstance(value, list) or not all(
                (x is None and silent_ok) or (isinstance(x, str) and 0 < len(x) <= MAX_TEXT)
                for x in value):
            raise bad(f"`{key}` must be a list of messages (text, 1-{MAX_TEXT} characters"
                      + ("; `~` for a silence" if silent_ok else "") + ")")
        lists[key] = tuple(value)
    return Persona(name=name, who=item.get("who", ""), wants=item.get("wants", ""),
                   knows=dict(knows), language=item.get("language", "en") or "en",
                   patience=patience, objections=lists["objections"],
                   leaves_when=item.get("leaves_when", ""), weight=weight,
                   script=lists["script"])
