"""Model keys pasted in the page: in the studio process's memory only.

A key is handed to the one model object built for it (litellm's ``api_key`` on each
call, engine.llm.client) and to nothing else: not to ``os.environ`` (the whole process's,
so the service a mounted studio runs in, the child processes it starts and
``/proc/<pid>/environ`` would all see it), never to a file, a log line or an answer of
the studio, which shows it masked (``sk-…abcd``). A model's error that quotes the key
has it replaced. It is gone when the studio stops.
"""

from __future__ import annotations

from ..errors import InvalidInput
from ..llm.models import make_model
from .model import HUMAN, StudioModel

__all__ = ["Keys", "masked"]


def masked(key: str) -> str:
    """``sk-proj-abcdef...wxyz`` -> ``sk-…wxyz``: enough to tell two keys apart."""
    head = key.split("-", 1)[0] + "-" if "-" in key[:8] else ""
    return f"{head}…{key[-4:]}" if len(key) >= 12 else "…"


class Keys:
    """The models given a key in the page, with the key masked."""

    def __init__(self) -> None:
        self._masked: dict[str, str] = {}

    def set(self, model: StudioModel, name: str, key: str | None) -> None:
        """The key of ``name`` for the studio's turns (``None``: back to the provider's key
        in the environment, if any). A model not built yet is built with it on its first turn
        (litellm takes seconds to import: a pasted key costs nothing until it is used).

        Raises:
            InvalidInput: ``name`` is "I am the model" or a scripted model (no key).
        """
        if name == HUMAN or name.startswith("scripted"):
            raise InvalidInput(f"`model`: {name!r} takes no key; give a litellm model string "
                               "such as gpt-4o-mini or anthropic/claude-3-5-haiku-latest")
        if key is None:
            model.keys.pop(name, None)
            self._masked.pop(name, None)
        else:
            model.keys[name] = key
            self._masked[name] = masked(key)
        if name in model.models:  # built already (litellm imported): built anew with this key
            model.models[name] = make_model(name, api_base=model.api_base, api_key=key)

    def view(self) -> dict[str, str]:
        return dict(self._masked)
