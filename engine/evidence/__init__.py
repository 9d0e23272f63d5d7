"""Evidence for a change to a funnel: `funnel replay` and `funnel simulate`.

`records` reads the sessions to replay (one read-only transaction); `play` plays one
session's recorded turns again in memory, with the engine's own steps and the model
outputs its turn records kept; `compare` says where two plays of a session part;
`replay` plays a population on the version it ran on and on an edit, and sums it up;
`continuation` plays the turns the recording cannot answer with a model (``--model``);
`simulate` walks a funnel with simulated customers (`personas`) on a temporary schema;
`gates` are the CI checks (``--fail-if``, ``--fail-under``); `render` prints either
as text, JSON, GitHub annotations or an HTML page. The product owner's guide is
docs/evidence.md.

May import: `engine.turn` and everything below it.
"""

from .compare import ExitChange, Outcome, SessionDiff
from .play import Playthrough, Recorded, play
from .replay import Replay, replay

__all__ = ["ExitChange", "Outcome", "Playthrough", "Recorded", "Replay", "SessionDiff", "play",
           "replay"]
