"""Finding, loading and checking scenario files: the JSON Schema
``schemas/scenario.schema.json``, then names against the funnel, reporting every
problem with its file and line. The format is documented in docs/scenarios.md.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any

import jsonschema

from ..errors import did_you_mean
from ..format import _yaml
from ..format.spec import ENGINE_COLUMNS, parse_duration
from ..funnel.compiled import CompiledFunnel
from ..sandbox.patterns import PatternRefused, compile_linear
from ..validation import packaged_validator

# The engine's time at a scenario's first turn unless it says `clock:` (a Monday morning).
DEFAULT_CLOCK = datetime.fromisoformat("2025-06-02T09:00:00+00:00")
START_ENGINE_KEYS = frozenset({"stage", "stage_iteration", "turns", "notices", "stage_history"})
_SCENARIO_KEY = re.compile(r"^scenario\s*:", re.MULTILINE)
_TURNS_KEY = re.compile(r"^turns\s*:", re.MULTILINE)
_FUNNEL_KEY = re.compile(r"^funnel\s*:", re.MULTILINE)


@dataclass
class Failure:
    """One failed expectation (``fail``) or a scenario that could not run (``error``)."""

    file: str
    line: int
    scenario: str
    turn: int | None
    message: str
    kind: str = "fail"

    def format(self) -> str:
        """``file:line: FAIL name turn N: expected X, got Y``."""
        tag = "FAIL" if self.kind == "fail" else "ERROR"
        where = f" turn {self.turn}" if self.turn else ""
        return f"{self.file}:{self.line}: {tag} {self.scenario}{where}: {self.message}"


@dataclass
class Turn:
    number: int  # 1-based
    customer: str
    llm: Any
    after: timedelta | None
    at: datetime | None
    expect: dict[str, Any]
    line: int
    lines: dict[str, int]  # expectation key ("stage", "state.customer.phone") -> line

    def line_of(self, key: str) -> int:
        return self.lines.get(key, self.line)


@dataclass
class Scenario:
    file: str
    name: str
    line: int
    funnel: Path
    funnel_line: int
    clock: datetime
    start: dict[str, Any] | None
    turns: list[Turn]
    located: _yaml.Located = field(repr=False)

    def line_at(self, *keys: str | int, key: bool = True) -> int:
        return self.located.where(keys, key=key)[0]

    def error(self, line: int, message: str) -> Failure:
        return Failure(self.file, line, self.name, None, message, "error")


def format_schema() -> dict[str, Any]:
    """The scenario format's JSON Schema (2020-12), shipped inside the package."""
    return dict(packaged_validator("scenario").schema)  # type: ignore[arg-type]


def _validator() -> jsonschema.Draft202012Validator:
    return packaged_validator("scenario")


def is_scenario(text: str) -> bool:
    """A top-level ``scenario:`` key, or ``turns:`` beside ``funnel:`` (a script such as
    ``funnels/puramur/demo.yaml`` has ``turns`` but names no funnel)."""
    return bool(_SCENARIO_KEY.search(text) or (_TURNS_KEY.search(text)
                                               and _FUNNEL_KEY.search(text)))


def discover(paths: Iterable[str | Path]) -> tuple[list[Path], list[str]]:
    """Expand files and folders into scenario files; return (files, paths that do not exist).

    A named file is always taken; in a folder (recursively), ``*.yaml``/``*.yml``
    files that :func:`is_scenario` are.
    """
    return _yaml.find_files(paths, is_scenario)


def load_scenario(path: Path) -> tuple[Scenario | None, list[Failure]]:
    """Read and check one scenario file against the format (not yet against its funnel)."""
    file, name = str(path), path.stem

    def err(line: int, message: str) -> list[Failure]:
        return [Failure(file, line, name, None, message, "error")]

    try:
        located = _yaml.load(path.read_text("utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        return None, err(0, f"cannot read the file: {exc}")
    except _yaml.YamlSyntaxError as exc:
        return None, err(exc.line, f"{exc}; fix the YAML syntax")
    data = located.data = _plain(located.data)
    if isinstance(data, dict) and isinstance(data.get("scenario"), str):
        name = data["scenario"]
    problems = [Failure(file, line, name, None, f"duplicate key '{keys[-1]}' (first on line "
                        f"{first}); remove or rename one", "error")
                for keys, line, _col, first in located.duplicates]
    if not isinstance(data, dict):
        return None, problems + err(1, "a scenario file is a mapping with `funnel` and `turns`")
    for error in sorted(_validator().iter_errors(data), key=lambda e: list(map(str, e.path))):
        problems += [Failure(file, line, name, None, message, "error")
                     for line, message in _describe(error, located)]
    if problems:
        return None, sorted(problems, key=lambda f: f.line)
    scenario = Scenario(
        file=file, name=name, line=1, funnel=path.parent / data["funnel"],
        funnel_line=located.where(("funnel",))[0], clock=DEFAULT_CLOCK,
        start=data.get("start"), turns=[], located=located)
    if not scenario.funnel.is_file():
        problems += err(scenario.funnel_line, f"no funnel file at {scenario.funnel} (the path "
                        "is relative to the scenario file)")
    if "clock" in data:
        clock = _timestamp(data["clock"])
        if clock is None:
            problems += err(scenario.line_at("clock", key=False),
                            f"clock {data['clock']!r} needs a time zone offset (+00:00 or Z)")
        scenario.clock = clock or DEFAULT_CLOCK
    for i, raw in enumerate(data["turns"]):
        turn, turn_problems = _turn(i, raw, scenario)
        problems += turn_problems
        scenario.turns.append(turn)
    return (None if problems else scenario), sorted(problems, key=lambda f: f.line)


def _turn(i: int, raw: dict[str, Any], scenario: Scenario) -> tuple[Turn, list[Failure]]:
    expect = dict(raw.get("expect") or {})
    lines = {key: scenario.line_at("turns", i, "expect", key) for key in expect}
    for path in expect.get("state") or {}:
        lines[f"state.{path}"] = scenario.line_at("turns", i, "expect", "state", path)
    for key in ("prompt_contains", "prompt_not_contains"):
        if isinstance(expect.get(key), str):
            expect[key] = [expect[key]]
    turn = Turn(number=i + 1, customer=raw["customer"], llm=raw["llm"],
                after=timedelta(seconds=parse_duration(raw["after"])) if "after" in raw else None,
                at=_timestamp(raw["at"]) if "at" in raw else None, expect=expect,
                line=scenario.line_at("turns", i, key=False), lines=lines)
    problems = []
    if "at" in raw and turn.at is None:
        problems.append(scenario.error(scenario.line_at("turns", i, "at", key=False),
                                       f"at {raw['at']!r} needs a time zone offset"))
    if "reply_matches" in expect:
        try:
            compile_linear(expect["reply_matches"])  # run on RE2: linear in the reply
        except PatternRefused as exc:
            problems.append(scenario.error(lines["reply_matches"],
                                           f"reply_matches is not a regular expression: {exc}"))
    return turn, problems


def check_against(scenario: Scenario, funnel: CompiledFunnel) -> list[Failure]:
    """The names a scenario uses that its funnel does not have: stages, fields, actions."""
    spec = funnel.spec
    stages = set(spec.stages)
    problems: list[Failure] = []

    def stage(name: str, line: int, what: str) -> None:
        if name not in stages:
            problems.append(scenario.error(line, f"{what}: funnel '{spec.name}' has no stage "
                                           f"'{name}'{did_you_mean(name, stages)}"))

    if scenario.start is not None:
        start = scenario.start
        stage(start["stage"], scenario.line_at("start", "stage", key=False), "start.stage")
        for key, value in start.items():
            line = scenario.line_at("start", key)
            if key in START_ENGINE_KEYS:
                continue
            if key not in spec.state:
                problems.append(scenario.error(line, f"start: '{key}' is not a state field of "
                                               f"funnel '{spec.name}'"
                                               f"{did_you_mean(key, spec.state)}"))
                continue
            bad = next(iter(funnel.rules.validators[key].iter_errors(value)), None)
            if bad is not None:
                problems.append(scenario.error(line, f"start.{key}: {bad.message}"))
            elif spec.cart and key == spec.cart.field and funnel.catalog is not None:
                for item in value:
                    sku = str(item.get("sku")) if isinstance(item, dict) else None
                    if sku not in funnel.catalog.by_sku:
                        problems.append(scenario.error(line, f"start.{key}: a cart line needs "
                                                       f"the `sku` of a catalog product, not "
                                                       f"{item!r}"))
    columns = set(spec.state) | set(ENGINE_COLUMNS)
    for turn in scenario.turns:
        exp = turn.expect
        if "stage" in exp:
            stage(exp["stage"], turn.line_of("stage"), "expect.stage")
        for path in exp.get("state") or {}:
            head = path.split(".")[0]
            if head not in columns:
                problems.append(scenario.error(turn.line_of(f"state.{path}"), (
                    f"expect.state: '{head}' is neither a state field nor an engine column of "
                    f"funnel '{spec.name}'{did_you_mean(head, columns)}")))
            elif head in spec.state:
                problem = _undeclared_property(path, spec.state[head].schema)
                if problem:
                    problems.append(scenario.error(turn.line_of(f"state.{path}"),
                                                   f"expect.state: {problem}"))
        for arrow in exp.get("transitions") or []:
            for name in (s.strip() for s in arrow.split("->")):
                stage(name, turn.line_of("transitions"), "expect.transitions")
        for name in exp.get("actions") or []:
            if name not in spec.actions:
                problems.append(scenario.error(turn.line_of("actions"), (
                    f"expect.actions: '{name}' is not an action of funnel '{spec.name}'"
                    f"{did_you_mean(name, spec.actions)}")))
    return sorted(problems, key=lambda f: f.line)


def _undeclared_property(path: str, schema: dict[str, Any]) -> str | None:
    """Why ``learner.langauge`` names nothing the field declares, or None when it may."""
    parts = path.split(".")
    for depth, part in enumerate(parts[1:], start=1):
        if part.isdigit() and schema.get("type") == "array":  # `lines.0.sku`
            items = schema.get("items")
            schema = items if isinstance(items, dict) else {}
            continue
        props = schema.get("properties")
        if not isinstance(props, dict) or schema.get("additionalProperties") is True:
            return None
        if part not in props:
            return (f"'{'.'.join(parts[:depth + 1])}': '{'.'.join(parts[:depth])}' declares no "
                    f"property '{part}'{did_you_mean(part, props)}; the expectation would "
                    "always see it absent")
        sub = props[part]
        schema = sub if isinstance(sub, dict) else {}
    return None


def _describe(error: jsonschema.ValidationError, located: _yaml.Located
              ) -> list[tuple[int, str]]:
    keys: tuple[str | int, ...] = tuple(error.absolute_path)
    where = "`" + ".".join(map(str, keys)) + "`" if keys else "the scenario"
    if error.validator == "additionalProperties" and isinstance(error.instance, dict) \
            and isinstance(error.schema, dict):
        allowed = set(error.schema.get("properties", {}))
        return [(located.where((*keys, name), key=True)[0],
                 f"unknown key '{name}' in {where}{did_you_mean(str(name), allowed)}; "
                 f"expected one of: {', '.join(sorted(allowed))}")
                for name in error.instance if name not in allowed]
    return [_describe_one(error, keys, where, located)]


def _describe_one(error: jsonschema.ValidationError, keys: tuple[str | int, ...], where: str,
                  located: _yaml.Located) -> tuple[int, str]:
    if error.validator == "anyOf" and keys and keys[-1] == "llm":
        return located.where(keys)[0], (
            f"{where}: give an output envelope with `reply`, a raw string (bad output), "
            "{output, repair} or {error}")
    if "propertyNames" in error.schema_path:
        line = located.where((*keys, str(error.instance)), key=True)[0]
        return line, f"{where}: {error.instance!r} is not a valid name or dotted path"
    if error.validator == "pattern" and keys and keys[-1] in ("after",):
        return located.where(keys)[0], f"{where}: {error.instance!r} is not a duration (7h, 30m)"
    if error.validator == "pattern" and keys and keys[-1] in ("clock", "at"):
        return located.where(keys)[0], (f"{where}: {error.instance!r} is not an ISO 8601 time "
                                        "with an offset (2025-06-02T09:00:00+00:00)")
    return located.where(keys)[0], f"{where}: {error.message}"


def _timestamp(text: str) -> datetime | None:
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        return None
    return value if value.tzinfo is not None else None


def _plain(value: Any) -> Any:
    """YAML reads unquoted times as datetime objects; scenarios compare them as ISO text."""
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value
