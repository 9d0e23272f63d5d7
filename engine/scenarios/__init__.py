"""Conversation scenarios (`funnel test`): YAML files that play a conversation against a
funnel with scripted model outputs and say what the engine must do at each turn.

`load` finds, reads and checks scenario files (their JSON Schema, then names
against the funnel), reporting every problem with its file and line; `run`
plays them on the real engine in a temporary PostgreSQL schema; `check`
compares each turn with its ``expect``; `report` prints the results;
`command` is `funnel test` itself; `record` turns a session's turn records into a
scenario, and `placeholders` takes the personal data the funnel declares out of it
(the studio's "Save as scenario"); `rerecord` re-records a scenario's failing
expectations from what the engine does now, in place (the studio's "accept"). The
format is documented in docs/scenarios.md. Nothing here imports litellm.

May import: `engine.turn` and everything below it.
"""

from .load import DEFAULT_CLOCK, Failure, Scenario, Turn, check_against, discover, load_scenario

__all__ = ["DEFAULT_CLOCK", "Failure", "Scenario", "Turn", "check_against", "discover",
           "load_scenario"]
