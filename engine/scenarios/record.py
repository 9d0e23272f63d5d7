"""`funnel record`: a real conversation, from its turn records, as a scenario.

Each turn record keeps the model's outputs as they were received
(``raw_output``: the answer, then the repair when there was one); with the
customer's message and what the turn did, that is a scenario turn::

    - customer: "I have a Sphynx cat"
      llm: {reply: ..., updates: {pet: {...}}}        # or {output, repair}, {error}
      expect: {stage: presentation, transitions: [discovery->presentation]}

Replayed with `funnel test`, the recording passes as long as the funnel does
what it did; once a change makes a transition stop firing, the turn where it
did fails, with the explanation of why.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from ..errors import InvalidInput
from ..format.spec import FunnelSpec

__all__ = ["recorded_scenario", "scenario_yaml"]

ANONYMIZED = "[anonymized]"


def _output(text: str) -> Any:
    """One raw model output as the scenario writes it: the envelope when it is JSON."""
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if isinstance(value, dict) else text


def _llm(record: Mapping[str, Any]) -> Any:
    raw = record.get("raw_output")
    if raw is None:
        raise InvalidInput(f"turn {record.get('id')} has no raw model output: it was recorded "
                           "before the engine kept them, or the session was anonymized")
    outputs = [_output(str(t)) for t in raw]
    if not outputs:  # the call failed: no output at all
        return {"error": str(record.get("error") or "the model call failed")}
    if len(outputs) == 1:
        first = outputs[0]
        if isinstance(first, dict) and "reply" in first and not record.get("fallback"):
            return first
        return {"output": first}
    return {"output": outputs[0], "repair": outputs[1]}


def _expect(record: Mapping[str, Any]) -> dict[str, Any]:
    expect: dict[str, Any] = {"stage": record["stage_after"]}
    transitions = [f"{t['from']}->{t['to']}" for t in record.get("transitions") or []]
    expect["transitions"] = transitions
    expect["actions"] = list(record.get("actions") or [])
    refused = [r["type"] for r in record.get("refused") or []]
    if refused:
        expect["refused"] = refused
    claims = [c.get("name") for c in record.get("claims") or [] if isinstance(c, Mapping)]
    if claims:
        expect["claims"] = claims
    if record.get("fallback"):
        expect["fallback"] = True
    return expect


def recorded_scenario(spec: FunnelSpec, session_id: str, records: Sequence[Mapping[str, Any]],
                      funnel_path: str) -> dict[str, Any]:
    """The scenario of a session's turn records (oldest first).

    Raises:
        InvalidInput: no turn recorded, an anonymized session, or turns without raw output.
    """
    if not records:
        raise InvalidInput(f"session {session_id!r} of funnel '{spec.name}' has no turn record "
                           "to replay")
    turns = []
    for record in records:
        customer = record.get("customer")
        if not customer or customer == ANONYMIZED:
            raise InvalidInput(f"session {session_id!r}: turn {record.get('id')} has no "
                               "customer message (anonymized or purged); nothing to replay")
        turn: dict[str, Any] = {}
        created = record.get("created_at")
        if created is not None:
            turn["at"] = created.isoformat() if hasattr(created, "isoformat") else str(created)
        turn.update(customer=customer, llm=_llm(record), expect=_expect(record))
        turns.append(turn)
    scenario: dict[str, Any] = {
        "scenario": f"recorded-{session_id}",
        "description": f"Recorded from session {session_id} of funnel '{spec.name}' "
                       f"(version {spec.version}) by `funnel record`.",
        "funnel": funnel_path,
    }
    first = records[0]["stage_before"]
    if first != spec.initial:
        scenario["start"] = {"stage": first}
    scenario["turns"] = turns
    return scenario


def scenario_yaml(scenario: Mapping[str, Any]) -> str:
    """The scenario as YAML, in the order people write it."""
    return yaml.safe_dump(dict(scenario), sort_keys=False, allow_unicode=True, width=100)
