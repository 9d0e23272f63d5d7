"""Personas from real traffic: `funnel simulate --personas-from-db`.

The recorded sessions of a period (the funnel's session table, one read-only
transaction) are profiled by what the funnel itself records: the path through the
stages, the objections raised (the items of a state field named ``*objection*``), the
language (``language.detected``), the products asked about (the presented products
and the cart's) and the number of turns. Sessions alike in path, objections and
language are one group; the groups are merged, the smallest into its nearest, until
at most ``k`` are left (:func:`cluster`). Each cluster is a :class:`Persona` weighted
by its share of the sessions, with a brief, the facts its customers gave and the
messages of its most typical session as the script.

Nothing personal is copied: the facts are the state's without the fields the funnel
declares personal or grounded (``retention: personal``, ``personal: true``,
``grounded: true``), and in the script every value of those fields, every number
that looks like a phone and every e-mail address is replaced by a stand-in ("Sam",
the phone region's example number, ``customer@example.com``).
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import yaml
from psycopg import sql

from ..errors import InvalidInput
from ..format.names import MESSAGES, PLAYGROUND
from ..format.personal import remove_path, value_at
from ..format.phones import example
from ..format.spec import FieldSpec, FunnelSpec
from ..store.playground import real_session
from .personas import MAX_PERSONAS, MAX_TEXT, Persona
from .records import _connect, _has

__all__ = ["Mined", "Profile", "cluster", "mine", "personas_yaml", "read_profiles",
           "write_personas"]

MAX_SCRIPT = 50  # a persona's patience is at most 50 turns
_PHONE = re.compile(r"\+?\d[\d\s().-]{5,}\d")
_EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")


@dataclass
class Profile:
    """One recorded session, as the clustering sees it."""

    session_id: str
    path: tuple[str, ...]  # the stages reached, in order
    objections: tuple[str, ...]
    language: str
    products: tuple[str, ...]
    turns: int
    state: dict[str, Any] = field(repr=False, default_factory=dict)

    @property
    def key(self) -> tuple[tuple[str, ...], tuple[str, ...], str]:
        return self.path, self.objections, self.language


@dataclass
class Cluster:
    profiles: list[Profile]

    @property
    def key(self) -> tuple[tuple[str, ...], tuple[str, ...], str]:
        """The most common (path, objections, language) of its sessions."""
        return Counter(p.key for p in self.profiles).most_common(1)[0][0]

    def typical(self) -> Profile:
        """The session of the cluster's key with the median number of turns, most
        common products first (ties: the smallest session id, for a stable file)."""
        key = self.key
        same = sorted((p for p in self.profiles if p.key == key),
                      key=lambda p: (p.turns, p.session_id))
        return same[len(same) // 2]


@dataclass
class Mined:
    """What mining found: the personas, the sessions behind each, and its cost."""

    funnel: str
    sessions: int
    since: float | None
    personas: list[Persona]
    counts: list[int]  # sessions behind each persona
    seconds: float = 0.0

    def as_json(self) -> dict[str, Any]:
        return {"funnel": self.funnel, "sessions": self.sessions, "since_seconds": self.since,
                "seconds": round(self.seconds, 3),
                "personas": [{"name": p.name, "sessions": n, "share": n / self.sessions,
                              "weight": p.weight, "language": p.language,
                              "turns": len(p.script), "who": p.who, "wants": p.wants,
                              "objections": list(p.objections), "knows": p.knows,
                              "script": list(p.script)}
                             for p, n in zip(self.personas, self.counts, strict=True)]}

    def as_text(self) -> str:
        lines = [f"mined {len(self.personas)} persona(s) of funnel {self.funnel} from "
                 f"{self.sessions} recorded session(s) in {self.seconds:.2f} s"]
        for p, n in zip(self.personas, self.counts, strict=True):
            lines.append(f"  {p.name:28} {n:>6} sessions ({n / self.sessions * 100:5.1f}%), "
                         f"weight {p.weight:>3}, {len(p.script)} message(s), {p.language}: "
                         f"{p.wants}")
        return "\n".join(lines) + "\n"


def read_profiles(url: str | None, spec: FunnelSpec, *, since: float | None = None,
                  now: datetime | None = None, include_playground: bool = False
                  ) -> list[Profile]:
    """Every recorded session of the funnel with a message in the last ``since``
    seconds (all when None), playground sessions left out unless asked for."""
    fields = [f for f in spec.state.values() if f.name not in ("stage_history",)]
    cols = [sql.Identifier(f.name) for f in fields]
    where: list[sql.Composable] = [sql.SQL("TRUE")]
    params: list[Any] = []
    conn = _connect(url)
    with conn:
        if since is not None:
            where.append(sql.SQL("last_message_at >= %s"))
            params.append((now or datetime.now().astimezone()) - timedelta(seconds=since))
        if not include_playground and _has(conn, PLAYGROUND):
            where.append(real_session(sql.Literal(spec.name),
                                      sql.Identifier(spec.table, "session_id")))
        if not _has(conn, spec.table):
            return []
        rows = conn.execute(sql.SQL(
            "SELECT session_id, stage, stage_history, turns{} FROM {} WHERE {} "
            "ORDER BY session_id").format(
                sql.SQL("").join(sql.SQL(", ") + c for c in cols), sql.Identifier(spec.table),
                sql.SQL(" AND ").join(where)), params).fetchall()
    out = []
    for row in rows:
        state = {f.name: v for f, v in zip(fields, row[4:], strict=True)}
        out.append(_profile(spec, str(row[0]), str(row[1]), row[2] or [], int(row[3] or 0),
                            state))
    return out


def _profile(spec: FunnelSpec, sid: str, stage: str, history: list[Any], turns: int,
             state: dict[str, Any]) -> Profile:
    path = [str(h["stage"]) for h in history if isinstance(h, dict) and h.get("stage")]
    path = list(dict.fromkeys([*path, stage] if stage not in path else path))
    objections: set[str] = set()
    for name, value in state.items():
        if "objection" in name and isinstance(value, list):
            for item in value:
                kind = item if isinstance(item, str) else next(
                    (str(item[k]) for k in ("objection", "type", "kind") if isinstance(item, dict)
                     and isinstance(item.get(k), str)), "")
                if kind:
                    objections.add(kind[:60])
    language = str(state.get(spec.language_detected) or "") if spec.language_detected else ""
    products: list[str] = []
    for listed in (spec.presented_field, spec.cart.field if spec.cart else None):
        for item in state.get(listed) or [] if listed else []:
            sku = item.get("sku") if isinstance(item, dict) else item
            if isinstance(sku, str | int) and str(sku) not in products:
                products.append(str(sku))
    return Profile(sid, tuple(path), tuple(sorted(objections)), language, tuple(products),
                   turns, state)


def _distance(a: Profile, b: Profile) -> float:
    """How unlike two sessions' customers are: the stages first, then the objections,
    the language, the products and the turns."""
    pa, pb = set(a.path), set(b.path)
    d = 3.0 * len(pa ^ pb) / max(1, len(pa | pb)) + 2.0 * (a.path[-1:] != b.path[-1:])
    oa, ob = set(a.objections), set(b.objections)
    d += len(oa ^ ob) / max(1, len(oa | ob)) + (a.language != b.language)
    xa, xb = set(a.products), set(b.products)
    return d + 0.5 * len(xa ^ xb) / max(1, len(xa | xb)) + 0.05 * min(abs(a.turns - b.turns),
                                                                        10)


def cluster(profiles: Sequence[Profile], k: int) -> list[Cluster]:
    """At most ``k`` clusters, largest first: the sessions alike in path, objections and
    language together; then the smallest merged into its nearest until ``k`` are left
    (the nearest by the distance between the two clusters' typical sessions)."""
    groups: dict[tuple[Any, ...], list[Profile]] = {}
    for p in profiles:
        groups.setdefault(p.key, []).append(p)
    clusters = [Cluster(ps) for _, ps in sorted(groups.items(), key=lambda g: (-len(g[1]),
                                                                               repr(g[0])))]
    typical = [c.typical() for c in clusters]
    while len(clusters) > max(1, k):
        small, rep = clusters.pop(), typical.pop()
        nearest = min(range(len(clusters)), key=lambda i: _distance(rep, typical[i]))
        clusters[nearest].profiles += small.profiles
    clusters.sort(key=lambda c: -len(c.profiles))
    return clusters


def mine(url: str | None, spec: FunnelSpec, *, since: float | None, k: int = 8,
         include_playground: bool = False) -> Mined:
    """Weighted, anonymized personas of the recorded sessions of ``since``.

    Raises:
        InvalidInput: no session was recorded in the period, or ``k`` is out of range.
    """
    if not 1 <= k <= MAX_PERSONAS:
        raise InvalidInput(f"--k: from 1 to {MAX_PERSONAS} personas; got {k}")
    started = time.perf_counter()
    profiles = read_profiles(url, spec, since=since, include_playground=include_playground)
    if not profiles:
        window = f"in the last {since:g} s" if since is not None else "at all"
        raise InvalidInput(f"no recorded session of funnel '{spec.name}' {window} in the "
                           "database: nothing to mine personas from (check --db and --since)")
    clusters = cluster(profiles, k)
    typical = [c.typical() for c in clusters]
    scripts = _scripts(url, spec.name, [t.session_id for t in typical])
    # Weights are the sessions themselves while they fit (an exact mix: -n of their sum
    # plays each cluster as often as it was recorded), else scaled to 100 for the largest.
    scale = min(1.0, 100 / len(clusters[0].profiles))
    personas, names = [], Counter[str]()
    for c, t in zip(clusters, typical, strict=True):
        base = f"reached_{t.path[-1] if t.path else spec.initial}"[:56]
        names[base] += 1
        personas.append(_persona(spec, c, t, scripts.get(t.session_id, []),
                                 f"{base}_{names[base]}",
                                 max(1, round(scale * len(c.profiles)))))
    return Mined(spec.name, len(profiles), since, personas, [len(c.profiles) for c in clusters],
                 time.perf_counter() - started)


def _scripts(url: str | None, funnel: str, ids: list[str]) -> dict[str, list[str]]:
    """The customer messages of the typical sessions, in order."""
    conn = _connect(url)
    with conn:
        rows = conn.execute(sql.SQL(
            "SELECT session_id, content FROM {} WHERE funnel = %s AND role = 'user' AND "
            "session_id = ANY(%s) ORDER BY session_id, id").format(sql.Identifier(MESSAGES)),
            (funnel, ids)).fetchall()
    out: dict[str, list[str]] = {}
    for sid, content in rows:
        out.setdefault(str(sid), []).append(str(content))
    return out


def _persona(spec: FunnelSpec, c: Cluster, t: Profile, messages: list[str], name: str,
             weight: int) -> Persona:
    secrets = _personal_values(spec, t.state)
    stand_ins = _stand_ins(spec)
    script = tuple(s for s in (_scrub(m, secrets, stand_ins)[:MAX_TEXT].strip()
                               for m in messages[:MAX_SCRIPT]) if s)
    products = Counter(x for p in c.profiles for x in p.products).most_common(3)
    objections = Counter(o for p in c.profiles for o in p.objections).most_common(3)
    languages = Counter(p.language for p in c.profiles if p.language).most_common(1)
    last = t.path[-1] if t.path else spec.initial
    final = spec.stages[last].final if last in spec.stages else False
    who = (f"a customer like {len(c.profiles)} recorded one(s) whose conversation went "
           f"{' -> '.join(t.path)}; any name or phone below is a stand-in")
    wants = ("to hear about " + ", ".join(x for x, _ in products)) if products else \
        "to find out what the shop offers"
    knows = _facts(spec, t.state)
    knows.update({k: v for k, v in stand_ins.items() if k != "other"
                  and k in _given(spec, t.state)})
    return Persona(
        name=name, who=who[:MAX_TEXT], wants=wants[:MAX_TEXT], knows=knows,
        language=languages[0][0] if languages else "en",
        patience=max(1, min(MAX_SCRIPT, len(script) or 1)),
        objections=tuple(o for o, _ in objections),
        leaves_when="" if final else f"the conversation is in {last} and has nothing new",
        weight=min(100, weight), script=script or ("Hi",))


def _personal(f: FieldSpec) -> list[tuple[str, ...]]:
    return [()] if f.personal else [*f.personal_paths, *f.grounded_paths]


def _strings(value: Any, key: str) -> list[tuple[str, str]]:
    """Every text inside ``value`` with the name of the key that holds it."""
    if isinstance(value, str):
        return [(value, key)]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in _strings(v, str(k))]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v, key)]
    return []


def _personal_values(spec: FunnelSpec, state: dict[str, Any]) -> list[tuple[str, str]]:
    """(value, kind) of every personal or grounded value of the session, longest first."""
    out = []
    for f in spec.state.values():
        for path in _personal(f):
            for value in value_at(state.get(f.name), path):
                out += [(text, _kind(key)) for text, key in
                        _strings(value, path[-1] if path else f.name) if len(text.strip()) >= 2]
    return sorted(set(out), key=lambda x: -len(x[0]))


def _kind(key: str) -> str:
    key = key.lower()
    for word, kind in (("phone", "phone"), ("tel", "phone"), ("mail", "email"),
                       ("address", "address"), ("street", "address"), ("city", "address"),
                       ("name", "name")):
        if word in key:
            return kind
    return "other"


def _stand_ins(spec: FunnelSpec) -> dict[str, str]:
    """The stand-in of each kind of personal value (the phone: its field's region's
    example number, as customers of that region write it)."""
    region = None
    for f in spec.state.values():
        found = re.search(r"'format': 'phone'[^}]*'region': '([A-Z]{2})'", str(f.schema))
        region = region or (found.group(1) if found else None)
    return {"name": "Sam", "phone": example(region), "email": "customer@example.com",
            "address": "1 Example Street", "other": "[withheld]"}


def _scrub(text: str, secrets: list[tuple[str, str]], stand_ins: dict[str, str]) -> str:
    for value, kind in secrets:
        text = re.sub(re.escape(value), stand_ins[kind], text, flags=re.IGNORECASE)
    text = _EMAIL.sub(stand_ins["email"], text)
    return _PHONE.sub(lambda m: stand_ins["phone"] if sum(ch.isdigit() for ch in m.group())
                      >= 7 else m.group(), text)


def _given(spec: FunnelSpec, state: dict[str, Any]) -> set[str]:
    """The kinds of personal value the session's customer gave."""
    return {kind for _, kind in _personal_values(spec, state)}


def _facts(spec: FunnelSpec, state: dict[str, Any]) -> dict[str, Any]:
    """The customer's facts: the state's objects without the personal and grounded
    parts, and without what the engine keeps for itself."""
    out: dict[str, Any] = {}
    for f in spec.state.values():
        value = state.get(f.name)
        if f.type != "object" or f.personal or f.owner == "engine" or not value:
            continue
        for path in _personal(f):
            value = remove_path(value, path)
        if isinstance(value, dict) and value:
            out[f.name] = _plain(value)
    return out


def _plain(value: Any) -> Any:
    """JSON-ish values as YAML writes them plainly (numbers from the database's text)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value if isinstance(value, str | int | float | bool) or value is None else str(value)


def personas_yaml(mined: Mined) -> str:
    """The personas as a personas file (engine.evidence.personas reads it back)."""
    header = (f"# Personas mined by `funnel simulate --personas-from-db` from {mined.sessions} "
              f"recorded session(s) of funnel {mined.funnel}.\n# Weights are each cluster's "
              "share of the sessions; names, phones and addresses are stand-ins.\n")
    items = []
    for p, n in zip(mined.personas, mined.counts, strict=True):
        item: dict[str, Any] = {"name": p.name, "who": p.who, "wants": p.wants,
                                "knows": p.knows, "language": p.language,
                                "patience": p.patience, "weight": p.weight}
        if p.objections:
            item["objections"] = list(p.objections)
        if p.leaves_when:
            item["leaves_when"] = p.leaves_when
        item["script"] = list(p.script)
        items.append((n, item))
    body = yaml.safe_dump({"personas": [i for _, i in items]}, allow_unicode=True,
                          sort_keys=False, width=100)
    return header + body


def write_personas(mined: Mined, path: str | Path) -> None:
    Path(path).write_text(personas_yaml(mined), "utf-8")
