"""F209/F210: a stage's prompt budget against its model's context window.

The window comes from litellm's model map, read as the JSON file litellm ships
(``model_prices_and_context_window_backup.json``) without importing litellm (seconds
to import; `funnel validate` imports neither litellm nor psycopg). A model the map does
not know, or no litellm installed, is not checked.

The budget plus the output's ``max_tokens`` must fit the window (F209, an error) and
should stay within 80% of it (F210, a warning: the share the memory design recommends,
leaving room for the tokenizer's error and the provider's own wrapping).
"""

from __future__ import annotations

import importlib.util
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..format.settings import ModelSettings, RecallSettings
from .diagnostics import Report, as_dict

SHARE = 0.8
_MAP = "model_prices_and_context_window_backup.json"


@lru_cache(maxsize=1)
def _windows() -> dict[str, int]:
    """Input context window by model name, from litellm's shipped map (empty if absent)."""
    spec = importlib.util.find_spec("litellm")  # finds the package; imports nothing
    folders = list(spec.submodule_search_locations or []) if spec else []
    for folder in folders:
        path = Path(folder) / _MAP
        try:
            data = json.loads(path.read_text("utf-8"))
        except (OSError, ValueError):
            continue
        return {name: int(v.get("max_input_tokens") or v.get("max_tokens") or 0)
                for name, v in data.items()
                if isinstance(v, dict) and isinstance(v.get("max_input_tokens") or
                                                      v.get("max_tokens"), int)}
    return {}


def context_window(model: str) -> int | None:
    """The model's input window in tokens, if litellm's map knows it (with or without
    its provider prefix: ``openai/gpt-4o-mini``)."""
    windows = _windows()
    for name in (model, model.split("/", 1)[-1]):
        if windows.get(name):
            return windows[name]
    return None


def check_context(data: dict[str, Any], stage: str, report: Report) -> None:
    """F209/F210 for one stage (its model and memory merged over the funnel's)."""
    raw = as_dict(as_dict(data.get("stages")).get(stage))
    model = {**as_dict(data.get("model")), **as_dict(raw.get("model"))}
    memory = {**as_dict(data.get("memory")), **as_dict(raw.get("memory"))}
    name, budget = model.get("name"), memory.get("prompt_budget")
    if not isinstance(name, str) or not isinstance(budget, int) or name.startswith("scripted"):
        return
    window = context_window(name)
    if window is None:
        return
    raw_output = model.get("max_tokens")
    output = raw_output if isinstance(raw_output, int) else 0
    need = budget + output
    keys = ("stages", stage, "memory") if "prompt_budget" in as_dict(raw.get("memory")) \
        else ("memory", "prompt_budget")
    where = f"stage '{stage}': " if keys[0] == "stages" else ""
    advice = (f"lower `memory.prompt_budget` to at most {int(window * SHARE) - output} "
              f"({int(SHARE * 100)}% of the window, less `max_tokens`), or choose a model "
              "with a larger context")
    known = {d.message for d in report.items}  # the funnel's budget: once, not per stage

    def at(severity: Any, code: str, message: str) -> None:
        if message not in known:
            report.at(keys, severity, code, message, key=True)

    if need > window:
        at("error", "F209", f"{where}prompt_budget {budget} + max_tokens {output} "
                  f"= {need} tokens does not fit {name}'s context window of {window} tokens "
                  f"(litellm's model map): {advice}")
    elif need > window * SHARE:
        at("warning", "F210", f"{where}prompt_budget {budget} + max_tokens "
                  f"{output} = {need} tokens is over {int(SHARE * 100)}% of {name}'s context "
                  f"window of {window} tokens (litellm's model map): {advice}")


# F212/F213: semantic recall against the stages (memory.recall): the recall deadline
# comes out of the model deadline; the recall budget is cut first by the prompt budget.
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
