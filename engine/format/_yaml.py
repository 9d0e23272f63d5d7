"""YAML loading that keeps line numbers and refuses duplicate keys.

PyYAML silently keeps the last of two equal keys; a funnel author who writes
``discovery:`` twice loses a stage without a word. Here that is an error, and
every value's position is kept so that diagnostics point at the right line.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

Path_ = tuple[str | int, ...]

# libyaml's parser when PyYAML has it: several times faster on big funnels. Its
# error messages are terser, so a text it refuses is parsed again in pure Python
# for the message (errors are rare; clean files never pay for that).
_FAST_LOADER: Any = getattr(yaml, "CSafeLoader", None) if yaml.__with_libyaml__ else None


@dataclass
class Located:
    """Parsed YAML data plus the 1-based (line, col) of every key and value."""

    data: Any
    positions: dict[Path_, tuple[int, int]] = field(default_factory=dict)
    key_positions: dict[Path_, tuple[int, int]] = field(default_factory=dict)
    duplicates: list[tuple[Path_, int, int, int]] = field(default_factory=list)

    def where(self, path: Path_, *, key: bool = False) -> tuple[int, int]:
        """Position of ``path``, falling back to its closest ancestor."""
        table = self.key_positions if key else self.positions
        p = tuple(path)
        while p:
            if p in table:
                return table[p]
            if p in self.positions:
                return self.positions[p]
            p = p[:-1]
        return self.positions.get((), (1, 1))


class YamlSyntaxError(Exception):
    def __init__(self, message: str, line: int, col: int) -> None:
        self.line = line
        self.col = col
        super().__init__(message)


# A funnel nests a dozen levels and holds a few thousand values. Past these
# limits a file is an attack (`[[[...]]]` 50,000 deep crashes the parser; seven
# levels of aliases expand to millions of values), refused before it is built.
MAX_DEPTH = 100
MAX_NODES = 200_000


def load(text: str) -> Located:
    """Parse one YAML document, recording positions and duplicate keys.

    Raises:
        YamlSyntaxError: the text is not YAML, nests deeper than ``MAX_DEPTH``
            or expands (aliases included) to more than ``MAX_NODES`` values;
            carries line and column.
    """
    _check_size(text)
    if _FAST_LOADER is not None:
        try:
            return _load(_FAST_LOADER(text))
        except YamlSyntaxError:
            pass  # report it with pure Python's clearer message, below
    try:
        return _load(yaml.SafeLoader(text))
    except RecursionError:  # a last resort: _check_size refuses what nests this deep
        raise YamlSyntaxError(f"YAML refused: nested more than {MAX_DEPTH} levels deep; "
                              "flatten it", 1, 1) from None
    except YamlSyntaxError as exc:
        if "expected <block end>" not in str(exc):
            raise
        raise YamlSyntaxError(_indentation_message(text, exc.line), exc.line, exc.col) from None


def _indentation_message(text: str, line: int) -> str:
    """PyYAML's "expected <block end>" said as what it is: a line indented like no key above."""
    lines = text.splitlines()
    here = lines[line - 1] if 0 < line <= len(lines) else ""
    indent = len(here) - len(here.lstrip(" "))
    above = sorted({len(t) - len(t.lstrip(" ")) for t in lines[: line - 1]
                    if t.strip() and not t.lstrip().startswith(("#", "-"))})
    return (f"YAML syntax error: line {line} is indented by {indent} space(s), which lines up "
            f"with no key above it (keys above are indented by {', '.join(map(str, above))}); "
            "indent it like the keys it belongs with")


def _check_size(text: str) -> None:
    """Refuse deep nesting and alias bombs from the parser's events, before any node is built.

    Events come from a state machine, not recursion, and an alias costs the
    size its anchor had: the expanded size is known without expanding.
    """
    if "&" not in text and _depth_bound(text) < MAX_DEPTH:
        return  # no anchor, so no alias; and too shallow to matter: skip the second parse
    anchors: dict[str, int] = {}
    stack: list[list[Any]] = [[None, 0]]  # [anchor, values so far] per open collection
    total = 0
    try:
        for event in yaml.parse(text, Loader=_FAST_LOADER or yaml.SafeLoader):
            if isinstance(event, yaml.CollectionStartEvent):
                if len(stack) > MAX_DEPTH:
                    _refuse(event, f"nested more than {MAX_DEPTH} levels deep; a funnel needs "
                            "far fewer: flatten it")
                stack.append([event.anchor, 1])
                continue
            if isinstance(event, yaml.CollectionEndEvent):
                anchor, size = stack.pop()
                if anchor is not None:
                    anchors[anchor] = size
                stack[-1][1] += size
                continue
            if isinstance(event, yaml.AliasEvent):
                size = anchors.get(event.anchor or "", 1)
            elif isinstance(event, yaml.ScalarEvent):
                size = 1
                if event.anchor is not None:
                    anchors[event.anchor] = 1
            else:
                continue
            stack[-1][1] += size
            total = sum(frame[1] for frame in stack)
            if total > MAX_NODES:
                _refuse(event, f"expands to more than {MAX_NODES:,} values (aliases `*name` "
                        "repeat what their anchor holds: an alias bomb?); write the values out")
    except yaml.YAMLError as exc:
        # libyaml refuses deep nesting itself (newer versions, at 1,000 levels): say why, as
        # pure Python's parser, which the load falls back to for its messages, recurses.
        mark = getattr(exc, "problem_mark", None)
        if _depth_bound(text) > MAX_DEPTH and mark is not None:
            raise YamlSyntaxError(f"YAML refused: nested more than {MAX_DEPTH} levels deep; a "
                                  "funnel needs far fewer: flatten it", mark.line + 1,
                                  mark.column + 1) from None
        return  # the load reports it, with its position


def _depth_bound(text: str) -> int:
    """An upper bound of the nesting depth, from the text alone (cheap, never too low).

    Block nesting needs indentation or ``- `` indicators on a line; flow nesting
    needs brackets (counted everywhere, quoted ones too: that only raises the bound).
    """
    indent = dashes = 0
    for line in text.splitlines():
        stripped = line.lstrip(" ")
        indent = max(indent, len(line) - len(stripped))
        dashes = max(dashes, stripped.count("- ") + stripped.count("? "))
    depth = flow = 0
    for ch in text:
        if ch in "[{":
            depth += 1
            flow = max(flow, depth)
        elif ch in "]}":
            depth -= 1
    return indent + dashes + flow + 2


def _refuse(event: Any, problem: str) -> None:
    mark = event.start_mark
    raise YamlSyntaxError(f"YAML refused: {problem}", mark.line + 1, mark.column + 1)


def _load(loader: Any) -> Located:
    try:
        node = loader.get_single_node()
        out = Located(data=None)
        if node is not None:
            out.data = _walk(loader, node, (), out)
        return out
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        problem = exc.problem or str(exc)
        context = f" ({exc.context})" if exc.context else ""
        raise YamlSyntaxError(f"YAML syntax error: {problem}{context}", line, col) from None
    except yaml.YAMLError as exc:
        raise YamlSyntaxError(f"YAML syntax error: {exc}", 1, 1) from None
    finally:
        loader.dispose()


def _walk(loader: Any, node: yaml.Node, path: Path_, out: Located) -> Any:
    out.positions[path] = (node.start_mark.line + 1, node.start_mark.column + 1)
    if isinstance(node, yaml.MappingNode):
        loader.flatten_mapping(node)
        result: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            try:
                hash(key)
            except TypeError:
                # `? [a, b]` keys: PyYAML's own constructor refuses them too.
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark,
                    "found unhashable key (a list or mapping used as a key)", key_node.start_mark,
                ) from None
            kpos = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
            child = (*path, key)
            if key in result:
                first = out.key_positions.get(child, (0, 0))[0]
                out.duplicates.append((child, kpos[0], kpos[1], first))
                continue
            out.key_positions[child] = kpos
            result[key] = _walk(loader, value_node, child, out)
        return result
    if isinstance(node, yaml.SequenceNode):
        return [_walk(loader, item, (*path, i), out) for i, item in enumerate(node.value)]
    return loader.construct_object(node, deep=True)


def find_files(paths: Iterable[str | Path], accept: Callable[[str], bool]
               ) -> tuple[list[Path], list[str]]:
    """Expand files and folders into YAML files; return (files, paths that do not exist).

    A named file is always taken; in a folder (recursively), the ``*.yaml`` and
    ``*.yml`` files whose text ``accept`` takes.
    """
    found: list[Path] = []
    missing: list[str] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            for candidate in sorted([*path.rglob("*.yaml"), *path.rglob("*.yml")]):
                try:
                    if accept(candidate.read_text("utf-8")):
                        found.append(candidate)
                except (OSError, UnicodeDecodeError):
                    continue
        elif path.exists():
            found.append(path)
        else:
            missing.append(str(raw))
    return list(dict.fromkeys(found)), missing  # a file named twice is read once
