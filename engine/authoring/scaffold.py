"""`funnel new`: a funnel folder that validates clean and whose scenarios pass out of the box.

The folder holds the funnel file, its prompts, a catalog when the funnel has one,
and two scenarios. No schema files: each stage declares its ``updates`` and
``actions`` and its output contract is derived from the funnel
(:mod:`engine.format.contract`; ``funnel schema`` prints it). Templates:
``minimal`` (written here), ``puramur`` and ``b2b_demo`` (copies of the shipped
reference funnels under a new name).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from ..errors import ConfigError
from ..format import _yaml
from ..format.spec import SQL_IDENTIFIER

__all__ = ["NAME_RULE", "TEMPLATES", "funnel_name", "scaffold"]

ROOT = Path(__file__).resolve().parent.parent.parent
TEMPLATES = ("minimal", "puramur", "b2b_demo")
NAME_RULE = ("lowercase letters, digits, `_` and `-` (which becomes `_`), starting with a "
             "letter, at most 41 characters")
_SCENARIOS = {"puramur": ("happy_path.yaml", "objections.yaml"),
              "b2b_demo": ("booking.yaml", "disqualified.yaml")}


def funnel_name(name: str) -> str:
    """``name`` as a funnel name, as `funnel new` and the studio's **New funnel** take it:
    trimmed, lowercased, each ``-`` a ``_`` (``Pet-Shop`` -> ``pet_shop``).

    Raises:
        ConfigError: what is left is not a funnel name (the rule is in the message).
    """
    ident = name.strip().lower().replace("-", "_")
    if not re.fullmatch(r"[a-z][a-z0-9_]{0,40}", ident) or not SQL_IDENTIFIER.fullmatch(ident):
        raise ConfigError(f"funnel name {name!r}: use {NAME_RULE}")
    return ident


# --- the folder -------------------------------------------------------------------------------


def scaffold(name: str, folder: Path, template: str = "minimal", *, catalog: bool = False
             ) -> list[Path]:
    """Write a new funnel called ``name`` into ``folder`` (which must not exist yet).

    Returns:
        The files written.

    Raises:
        ConfigError: a bad name or template, or the folder exists.
    """
    if not re.fullmatch(r"[a-z][a-z0-9_]{0,40}", name) or not SQL_IDENTIFIER.fullmatch(name):
        raise ConfigError(f"funnel name {name!r}: use lowercase letters, digits and `_`, "
                          "starting with a letter (at most 41 characters)")
    if template not in TEMPLATES:
        raise ConfigError(f"no template {template!r}; choose one of {', '.join(TEMPLATES)}")
    if folder.exists():
        raise ConfigError(f"{folder} exists already; choose another folder (nothing written)")
    folder.mkdir(parents=True)
    try:
        if template == "minimal":
            _minimal(name, folder, catalog)
        else:
            _copy(name, folder, template)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)  # nothing half-written
        raise
    return sorted(p for p in folder.rglob("*") if p.is_file())


def _copy(name: str, folder: Path, template: str) -> None:
    source = ROOT / "funnels" / f"{template}.yaml"
    text = source.read_text("utf-8")
    data = _yaml.load(text).data
    old_table = data["table"]
    text = re.sub(r"^funnel: .*$", f"funnel: {name}", text, count=1, flags=re.M)
    text = re.sub(r"^table: .*$", f"table: {name}_sessions_state", text, count=1, flags=re.M)
    text = re.sub(r"^prompts: .*$", "prompts: prompts", text, count=1, flags=re.M)
    text = re.sub(r"^schemas: .*$", "schemas: schemas", text, count=1, flags=re.M)
    if data.get("schemas"):  # a funnel with hand-written contracts brings them along
        shutil.copytree(source.parent / data["schemas"], folder / "schemas")
    text = re.sub(r"^catalog: .*$", "catalog: catalog.yaml", text, count=1, flags=re.M)
    # Index names are global in the database: make them the new funnel's own.
    text = re.sub(r"name: idx_(\w+)", lambda m: f"name: idx_{name}_{m[1]}", text)
    text = text.replace(old_table, f"{name}_sessions_state")
    (folder / "funnel.yaml").write_text(text, "utf-8")
    shutil.copytree(Path(source.parent / data.get("prompts", "prompts")), folder / "prompts")
    if data.get("catalog"):
        shutil.copy(source.parent / data["catalog"], folder / "catalog.yaml")
    knowledge = data.get("knowledge")
    if knowledge:  # the knowledge folder travels with the funnel, as `knowledge/`
        shipped_folder = knowledge if isinstance(knowledge, str) else knowledge["folder"]
        shutil.copytree(source.parent / shipped_folder, folder / "knowledge")
        text = text.replace(str(shipped_folder), "knowledge", 1)
        (folder / "funnel.yaml").write_text(text, "utf-8")
    for raw in (data.get("actions") or {}).values():  # hook modules travel with the funnel
        hook = (raw or {}).get("hook")
        if isinstance(hook, str) and (source.parent / f"{hook.split(':')[0]}.py").is_file():
            shutil.copy(source.parent / f"{hook.split(':')[0]}.py", folder)
    (folder / "scenarios").mkdir()
    for scenario in _SCENARIOS[template]:
        body = (source.parent / template / "scenarios" / scenario).read_text("utf-8")
        body = re.sub(r"^# yaml-language-server:.*\n", "", body, count=1, flags=re.M)
        body = re.sub(r"^funnel: .*$", "funnel: ../funnel.yaml", body, count=1, flags=re.M)
        (folder / "scenarios" / scenario).write_text(body, "utf-8")


def _minimal(name: str, folder: Path, catalog: bool) -> None:
    text = _MINIMAL.replace("NAME", name)
    if catalog:
        text = text.replace("  # CATALOG-STATE\n", "  presented_products: {type: array, "
                            "default: []}\n")
        text = text.replace("# CATALOG\n", "catalog: catalog.yaml\npresented:\n  field: "
                            "presented_products\n\n")
        text = text.replace("  # CATALOG-ACTION\n", "  present_products: {builtin: "
                            "present_products}\n")
        text = text.replace("[request_handoff]  # CATALOG-STAGE",
                            "[present_products, request_handoff]")
        (folder / "catalog.yaml").write_text(_CATALOG, "utf-8")
    text = text.replace("  # CATALOG-STAGE", "")
    text = re.sub(r"^.*# CATALOG.*\n", "", text, flags=re.M)
    (folder / "funnel.yaml").write_text(text, "utf-8")
    (folder / "prompts").mkdir()
    for stage, body in _PROMPTS.items():
        # The catalog does not change from turn to turn: it belongs to the static part.
        prompt = body.replace("CATALOG", _CATALOG_PROMPT if catalog else "")
        (folder / "prompts" / f"{stage}.j2").write_text(prompt, "utf-8")
    (folder / "scenarios").mkdir()
    for file, body in _MINIMAL_SCENARIOS.items():
        (folder / "scenarios" / file).write_text(body, "utf-8")


_MINIMAL = """\
# NAME: a funnel created by `funnel new` (template: minimal). Change the stages, the
# state and the prompts, then run:
#   funnel validate --strict NAME/ && funnel test NAME/scenarios/
# Each stage's output contract is derived from its `updates` and `actions` and their
# declarations here: `funnel schema NAME/funnel.yaml --stage greeting` prints one.
funnel: NAME
version: 1
table: NAME_sessions_state
description: Find out what the customer needs, take their contacts, hand over to a person.
initial: greeting
prompts: prompts
# CATALOG

state:
  customer:
    type: object
    default: {}
    retention: personal
    properties:
      name: {type: string, maxLength: 80}
      phone: {type: string, maxLength: 40}
  need: {type: string, default: "", maxLength: 300}
  score: {type: integer, default: 0}
  handoff_at: {type: string, format: date-time, nullable: true}
  handoff_reason: {type: string, nullable: true}
  # CATALOG-STATE

completeness:
  field: score
  rules:
    - {when: need, points: 50}
    - {when: customer.name, points: 25}
    - {when: customer.phone, points: 25}

handoff:
  stage: done
  triggered_at: handoff_at
  reason: handoff_reason

actions:
  request_handoff: {builtin: request_handoff, reasons: [explicit_request]}
  # CATALOG-ACTION

output:                   # what the model may write and do (docs/funnel-format.md#output-contract)
  actions: [request_handoff]   # the stages that list no `actions:` of their own

global_transitions:
  - to: done
    when: handoff_requested == 'explicit_request'
    reason: explicit_request

stages:
  greeting:
    description: Say hello and ask what the customer needs.
    fallback: Hello! What can I help you with?
    updates: [need]
    transitions:
      - to: discovery

  discovery:
    description: Understand the need well enough to pass it on.
    fallback: Could you tell me a little more about what you need?
    updates: [need, customer]
    actions: [request_handoff]  # CATALOG-STAGE
    max_iterations: {limit: 6, to: done, reason: stalled}
    transitions:
      - to: contact
        when: need

  contact:
    description: Take the customer's name and phone number.
    fallback: May I have your name and phone number, so that a colleague can call you?
    updates: [customer]
    transitions:
      - to: done
        when: score >= 100
        reason: contacts_taken

  done:
    description: Thank the customer; a person takes over.
    actions: []
    final: true
"""

# Each prompt is laid out for providers' prefix caches (docs/funnel-format.md, "Prompt
# layout"): the static instructions first, what changes every turn in `{% block turn %}`.
_TURN = "{% block turn %}\nKnown facts (JSON): {{ state_json }}\n"
_PROMPTS = {
    "greeting": "You are the assistant of this business. Greet the customer and ask what they "
                "need.\nIf they already said it, put it in \"updates.need\" (one sentence).\n"
                "If they ask for a person, add the action {\"type\": \"request_handoff\", "
                "\"reason\": \"explicit_request\"}.\n" + _TURN + "{% endblock %}\n",
    "discovery": "You are the assistant of this business. Find out what the customer needs.\n"
                 "When you understand it, put it in \"updates.need\" (one sentence).\n"
                 "CATALOG" + _TURN + "{% if offer %}{{ offer }}\n{% endif %}{% endblock %}\n",
    "contact": "You are the assistant of this business. Ask for the customer's name and phone "
               "number and put them in \"updates.customer\".\n" + _TURN
               + "The customer needs: {{ need }}.\n"
               "{% if customer.name %}Their name is {{ customer.name }}.{% endif %}\n"
               "{% endblock %}\n",
    "done": "You are the assistant of this business. A colleague takes over: thank the customer "
            "and do not promise anything else.\n" + _TURN
            + "Thank {{ customer.name or 'the customer' }}; a colleague will call "
            "{{ customer.phone or 'soon' }}.\n{% endblock %}\n",
}

_CATALOG_PROMPT = ("Products you may present (never invent others):\n"
                   "{% for p in catalog %}- {{ p.sku }}: {{ p.name }}, {{ p.price }} {{ currency }}\n"
                   "{% endfor %}To present some, add {\"type\": \"present_products\", "
                   "\"skus\": [...]}.\n")

_CATALOG = """\
# The products the assistant may present: the only source of names and prices.
currency: EUR
products:
  - {sku: BASIC, name: Basic plan, price: 10}
  - {sku: PRO, name: Pro plan, price: 30}
"""

_MINIMAL_SCENARIOS = {
    "happy_path.yaml": """\
# From greeting to the hand-off: the need, then the contacts.
scenario: happy-path
funnel: ../funnel.yaml
turns:
  - customer: "Hi!"
    llm: {reply: "Hello! What can I help you with?"}
    expect: {stage: discovery, transitions: [greeting->discovery]}

  - customer: "I need a quote for a website"
    llm:
      reply: "Happy to help. May I have your name and phone number?"
      updates: {need: "a quote for a website"}
    expect: {stage: contact, state: {need: "a quote for a website", score: 50}}

  - customer: "Anna, +15551234567"
    llm:
      reply: "Thank you, Anna! A colleague will call you."
      updates: {customer: {name: Anna, phone: "+15551234567"}}
    expect:
      stage: done
      state: {score: 100, handoff_reason: contacts_taken, handoff_at: present}
""",
    "asks_for_a_person.yaml": """\
# The customer asks for a person at once: the global transition hands over.
scenario: asks-for-a-person
funnel: ../funnel.yaml
turns:
  - customer: "Hello"
    llm: {reply: "Hello! What can I help you with?"}
    expect: {stage: discovery}

  - customer: "I want to talk to a human"
    llm:
      reply: "Of course, a colleague will take over."
      actions: [{type: request_handoff, reason: explicit_request}]
    expect:
      stage: done
      actions: [request_handoff]
      state: {handoff_reason: explicit_request}
""",
}
