"""A funnel's declared fixture states for its snapshots (``<funnel>/snapshots/fixtures.yaml``)::

    fixtures:
      - name: cart_near_gift          # the entry's name in the stage's snapshot
        stage: cart_building
        state:                        # state fields; the others keep their defaults
          cart: [{sku: PR100101, qty: 2}]
        customer: What is in my cart?  # optional: the message of the turn

Each fixture is played as a one-turn scenario seeded with its state (``start:``), so its
prompt is the one the engine renders. A fixture that does not match the funnel (an
unknown stage or field, a value its schema refuses) is a :class:`~engine.errors.ConfigError`
naming the file and line.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError, did_you_mean
from ..format import _yaml
from ..funnel.compiled import CompiledFunnel
from .load import DEFAULT_CLOCK, Scenario, Turn, check_against
from .snapshot import FIXTURES, folder

_KEYS = ("name", "stage", "state", "customer")
_CUSTOMER = "Hello"
# The model's scripted answer: only the first request's prompt is kept.
_OUTPUT = {"reply": "…"}


class _At(_yaml.Located):
    """The fixtures file's positions, read as the positions of one scenario's ``start``."""

    def __init__(self, located: _yaml.Located, index: int) -> None:
        super().__init__(located.data, located.positions, located.key_positions)
        self.index = index

    def where(self, path: _yaml.Path_, *, key: bool = False) -> tuple[int, int]:
        p = tuple(path)
        if p[:2] == ("start", "stage"):
            p = ("fixtures", self.index, "stage", *p[2:])
        elif p[:1] == ("start",):
            p = ("fixtures", self.index, "state", *p[1:])
        else:
            p = ("fixtures", self.index)
        return super().where(p, key=key)


def load_fixtures(path: Path, funnel: CompiledFunnel) -> list[Scenario]:
    """The fixtures of ``path`` as one-turn scenarios on ``funnel``.

    Raises:
        ConfigError: the file is not YAML, not in the format above, or a fixture does
            not match the funnel's stages and state; ``file:line: what, and the fix``.
    """
    file = str(path)
    try:
        located = _yaml.load(path.read_text("utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{file}: cannot read the fixtures file: {exc}") from None
    except _yaml.YamlSyntaxError as exc:
        raise ConfigError(f"{file}:{exc.line}: {exc}; fix the YAML syntax") from None
    data = located.data
    listed = data.get("fixtures") if isinstance(data, dict) else None
    if not isinstance(listed, list):
        raise ConfigError(f"{file}:1: a fixtures file is a mapping with a `fixtures:` list of "
                          "{name, stage, state, customer}")
    out: list[Scenario] = []
    names: set[str] = set()
    for i, raw in enumerate(listed):
        line = located.where(("fixtures", i))[0]
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str) \
                or not isinstance(raw.get("stage"), str):
            raise ConfigError(f"{file}:{line}: fixture {i + 1} needs a `name` and a `stage` "
                              "(text)")
        for key in raw:
            if key not in _KEYS:
                raise ConfigError(f"{file}:{located.where(('fixtures', i, key), key=True)[0]}: "
                                  f"unknown key '{key}' in fixture '{raw['name']}'"
                                  f"{did_you_mean(str(key), _KEYS)}; expected one of: "
                                  f"{', '.join(_KEYS)}")
        if raw["name"] in names or " " in raw["name"]:
            raise ConfigError(f"{file}:{line}: fixture name {raw['name']!r} is used twice or "
                              "holds a space; give each fixture its own one-word name")
        names.add(raw["name"])
        state = raw.get("state") or {}
        if not isinstance(state, dict):
            raise ConfigError(f"{file}:{line}: fixture '{raw['name']}': `state` is a mapping of "
                              "state fields to values")
        scenario = Scenario(
            file=file, name=raw["name"], line=line, funnel=funnel.spec.path, funnel_line=line,
            clock=DEFAULT_CLOCK, start={**state, "stage": raw["stage"]},
            turns=[Turn(1, str(raw.get("customer") or _CUSTOMER), _OUTPUT, None, None, {},
                        line, {})],
            located=_At(located, i))
        problems = check_against(scenario, funnel)
        if problems:
            p = problems[0]
            text = p.message.replace("start.stage", "stage").replace("start.", "state.") \
                .replace("start: ", "state: ")
            raise ConfigError(f"{file}:{p.line}: fixture '{raw['name']}': {text}; the "
                              "fixture's state must match the funnel's declared state")
        out.append(scenario)
    return out


def fixtures_file(funnel: CompiledFunnel) -> Path | None:
    """The funnel's fixtures file, when it has one."""
    path = folder(funnel) / FIXTURES
    return path if path.is_file() else None


__all__ = ["fixtures_file", "load_fixtures"]

