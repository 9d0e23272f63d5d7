"""Real model calls: structured-output strategies, portable schemas, retries, fallbacks.

- :mod:`engine.llm.strategy`: how each model is asked for the stage's envelope;
- :mod:`engine.llm.portable`: the form of a stage schema every server can compile;
- :mod:`engine.llm.strict`: the form a provider enforces (OpenAI's ``strict: true``, the
  closed form of Anthropic's output_format and Gemini), which model gets which;
- :mod:`engine.llm.forced_nulls`: the nulls a strict form forced, read as absent;
- :mod:`engine.llm.retry`: the retry policy and the turn deadline;
- :mod:`engine.llm.cache`: providers' prompt caches (Claude's ``cache_control`` mark,
  on every route that carries it; the cached tokens a response reports);
- :mod:`engine.llm.client`: one request through litellm, with all of the above;
- :mod:`engine.llm.doctor`: ``funnel doctor``, what an endpoint accepts.

Nothing here imports litellm: :class:`engine.llm.models.LiteLLMModel` hands it in.

May import: `engine.funnel` (for `funnel doctor`), `engine.records`, `engine.format`
and below; never the store or the turn.
"""

from .portable import portable_schema
from .strategy import CHOICES, STRATEGIES

__all__ = ["CHOICES", "STRATEGIES", "portable_schema"]
