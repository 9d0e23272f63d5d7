"""The turn: one customer message in, one reply and one saved row out.

`engine` holds :class:`~engine.turn.engine.Engine` and its turn, step by step;
`begin` the turn built from the row as read; `steps` the steps between load and
save, `save` the save and a failed turn's end; `data` what a turn carries and
records; `routing` the version and variant a turn runs on; `advance` moving
between stages and `explain` why; `prompts` and `budget` the prompt and its
caps; `output` validation, repair and fallback; `language` the customer's
language; `notify` the hand-off alert; `playground` the studio's turns, which
queue nothing that leaves the process; `invariants` what every saved session
must satisfy (`funnel check-state`).

May import: `engine.memory`, `engine.knowledge`, `engine.versions`,
`engine.experiments`, `engine.store`, `engine.llm`, `engine.funnel` and below.
"""
