"""Reserved names: what conditions and templates may read besides state fields, the
engine's own tables, and the Python modules a hook may not come from.

Documented for authors in docs/funnel-format.md; the validator checks every
name a condition or template reads against these (F402, F203).
"""

from __future__ import annotations

import sys

# Names a condition may use besides the state fields (see docs/funnel-format.md).
CONDITION_NAMES: frozenset[str] = frozenset(
    {"stage", "stage_iteration", "actions", "handoff_requested", "returning", "turns"}
)

# Names a prompt template may use besides the state fields.
PROMPT_NAMES: frozenset[str] = frozenset(
    {
        "funnel",
        "stage",
        "stage_description",
        "stage_iteration",
        "iteration_limit_reached",
        "offer",
        "state",
        "state_json",
        "presented",
        "presented_skus",
        "catalog",
        "currency",
        "thresholds",
        "messages",
        "summary",
        "returning",
        "idle_for",
        "notices",
        "customer_message",
        "now",
        "handoff",
        "turns",
        "knowledge",
    }
)

# What the static part of a stage template (everything outside its `state` and `turn` blocks)
# may read: nothing that changes from turn to turn, so that the prompt's start is the
# same for every turn of the stage and a provider's prefix cache can reuse it.
STATIC_PROMPT_NAMES: frozenset[str] = frozenset(
    {"funnel", "stage", "stage_description", "catalog", "currency", "thresholds"}
)
TURN_BLOCK = "turn"
# The template's optional block of what changes with the state, not every turn: it goes
# before the recent messages, the turn block after them (engine.turn.budget.assemble).
STATE_BLOCK = "state"
PROMPT_BLOCKS = (STATE_BLOCK, TURN_BLOCK)

# The tables every funnel shares (engine/store/ddl.py creates them). A funnel's own
# `table:` may not take one of these names (F005).
MESSAGES = "funnel_messages"
TURNS = "funnel_turns"
OUTBOX = "funnel_outbox"
MIGRATIONS = "funnel_migrations"
LEASES = "funnel_leases"
INBOUND = "funnel_inbound"
UNREACHABLE = "funnel_unreachable"
KNOWLEDGE = "funnel_knowledge"
KNOWLEDGE_SETS = "funnel_knowledge_sets"
KNOWLEDGE_TERMS = "funnel_knowledge_terms"
CONVERSIONS = "funnel_conversions"
VERSIONS = "funnel_versions"
JOBS = "funnel_jobs"
EXITS = "funnel_exits"
CONTROL = "funnel_control"
CONTROL_EVENTS = "funnel_control_events"
EMBEDDINGS = "funnel_embeddings"
# The sessions the studio made (engine.store.playground): never a customer's.
PLAYGROUND = "funnel_playground"
# Each session's next follow-up (engine.store.follow_ups, docs/follow-ups.md).
FOLLOW_UPS = "funnel_follow_ups"
SHARED_TABLES: tuple[str, ...] = (MESSAGES, TURNS, OUTBOX, MIGRATIONS, LEASES, INBOUND,
                                  UNREACHABLE, KNOWLEDGE, KNOWLEDGE_SETS, KNOWLEDGE_TERMS,
                                  CONVERSIONS, VERSIONS, JOBS, EXITS, CONTROL, CONTROL_EVENTS,
                                  EMBEDDINGS, PLAYGROUND, FOLLOW_UPS)


def refused_hook_module(module: str) -> str | None:
    """Why a funnel may not name the installed ``module`` as a hook, or None.

    A hook is the author's own code: a ``.py`` file beside the funnel, or an installed
    package. Never the standard library (``sys:exit``, ``os:system``) nor the engine.
    """
    top = module.partition(".")[0]
    if top in sys.stdlib_module_names or top in sys.builtin_module_names:
        return (f"'{module}' is a module of Python's standard library; a hook must be "
                "your own code: a .py file beside the funnel or an installed package")
    if top == "engine":
        return f"'{module}' is part of the engine itself; a hook must be your own code"
    return None
