"""Funnel Studio: a product owner sees, tries and changes a funnel in the browser.

`funnel studio FUNNEL...` (and ``/studio`` in `funnel serve`, for admin keys): a chat
with the funnel beside its stage graph, state, completeness, the why of every exit
and the prompt as sent; "I am the model" (a form generated from the stage's output
schema, answered through the model's own path); rewind and branch; live edits with
their diagnostics; an editor for its files (a new funnel, its migrations); save as a
scenario and run the scenarios; the real sessions and their transcripts. docs/studio.md
is the guide.

- `playground`: :class:`Studio`, the funnels and their engine, and what the page asks;
- `model`: :class:`StudioModel`, the model of the studio's engine;
- `views`: the panels, from what a turn already returns; `graph`: the stage graph as SVG;
- `watch`: the files watched and validated; `sql`: the sessions list, transcript pages;
- `scenarios`: the funnel's scenarios folder: run all, accept after the diff, save;
- `simulation`: the Simulate tab's one run at a time (`funnel simulate`, cancellable);
- `evidence_api`: their routes, plugged into the app by a table;
- `app`: the Starlette app; `bodies`: its request bodies (pydantic); `server`: uvicorn;
- `turn_out`: a turn's answer to the page, and what a playground turn would have sent;
- `desk`: a customer's session as a manager sees it (take over, send, release);
  `plain`: a refused answer in plain words, the stage prompt as the model reads it;
- `editor`, `editor_api`, `make`, `keys`: the Editor tab (files, checks as typed, safe saves,
  a new funnel, migrations, a model key in memory);
- `static/`: the page (plain HTML, CSS, JavaScript: no build step; the editor's CodeMirror 5
  in `static/vendor/codemirror/` with its license).

May import: `engine.scenarios`, `engine.evidence`, `engine.turn` and everything below
them; never the service or the CLI (the service mounts it).
"""

from .app import create_studio_app
from .playground import Studio

__all__ = ["Studio", "create_studio_app"]
