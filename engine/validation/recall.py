"""F212/F213: semantic recall's settings against the stages' (``memory.recall``).

- F212 (warning): ``memory.recall.deadline`` is not under a stage's ``model.deadline``.
  The turn waits for the customer message's embedding before it calls the model, and
  that wait comes out of the model's deadline: a recall deadline as long as the model's
  would leave the model no time when the embedder is slow.
- F213 (warning): ``memory.recall.budget`` is not under a stage's ``memory.prompt_budget``:
  the recalled messages, cut first by the prompt budget, would rarely fit.

Whether the database has pgvector is said at start (engine.memory.recall): `funnel
validate` reads no database.
"""

from __future__ import annotations

from typing import Any

from ..format.settings import ModelSettings, RecallSettings
from .diagnostics import Report, as_dict


def check_recall(data: dict[str, Any], report: Report) -> None:
    """F212/F213 for the funnel's ``memory.recall``, against every stage."""
    raw = as_dict(as_dict(data.get("memory")).get("recall"))
    if not raw.get("embedder"):
        return
    deadline = raw.get("deadline", RecallSettings.deadline)
    budget = raw.get("budget", RecallSettings.budget)
    top_model = as_dict(data.get("model"))
    top_memory = as_dict(data.get("memory"))
    said: set[str] = set()  # each warning once, for the first stage it concerns
    for stage, spec in as_dict(data.get("stages")).items():
        spec = as_dict(spec)
        model = {**top_model, **as_dict(spec.get("model"))}
        memory = {**top_memory, **as_dict(spec.get("memory"))}
        limit = model.get("deadline", ModelSettings.deadline)
        if "F212" not in said and isinstance(deadline, int | float) \
                and isinstance(limit, int | float) and deadline >= limit:
            said.add("F212")
            report.at(("memory", "recall", "deadline"), "warning", "F212",
                      f"memory.recall.deadline {deadline:g} s is not under stage '{stage}''s "
                      f"model.deadline {limit:g} s: the turn waits for the embedding before "
                      "the model, out of the model's time; keep it well under (default 1 s)")
        prompt = memory.get("prompt_budget")
        if "F213" not in said and isinstance(budget, int) and isinstance(prompt, int) \
                and budget >= prompt:
            said.add("F213")
            report.at(("memory", "recall", "budget"), "warning", "F213",
                      f"memory.recall.budget {budget} is not under stage '{stage}''s "
                      f"memory.prompt_budget {prompt}: recalled messages are cut first and "
                      "would rarely fit; lower the recall budget (default 400) or raise the "
                      "prompt budget")
