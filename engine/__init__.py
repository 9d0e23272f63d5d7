"""funnel: run LLM sales conversations as finite-state machines declared in YAML.

The LLM proposes; code decides. Load a funnel once, then hand each customer
message to :meth:`Engine.handle`::

    from engine import Engine

    engine = await Engine.open("funnels/puramur.yaml", model="gpt-4o-mini")
    result = await engine.handle("session-1", "Hi! I have a Sphynx cat")
    print(result.reply, result.stage_after)
"""

import importlib
from typing import TYPE_CHECKING, Any

from .errors import (
    ActionRefused,
    ConcurrentUpdate,
    ConfigError,
    FunnelError,
    FunnelInvalid,
    ModelError,
    PromptTooLarge,
    SchemaOutdated,
    StoreError,
    StoreUnavailable,
)

if TYPE_CHECKING:
    from .format.catalog import Catalog, Product, load_catalog
    from .format.spec import FunnelSpec
    from .funnel.actions import ActionCall, ActionOutcome
    from .funnel.compiled import CompiledFunnel, load_funnel
    from .llm.models import Completion, Model, ModelRequest, ScriptedModel, make_model
    from .store import Store, open_store
    from .sync import SyncEngine
    from .turn.engine import Engine, TurnResult
    from .validation import Diagnostic, validate_paths

# The other public names load on first use (PEP 562): `funnel validate` needs the
# validator, not the machine, the turn or the store.
_LAZY = {
    "ActionCall": "funnel.actions", "ActionOutcome": "funnel.actions",
    "Catalog": "format.catalog", "Product": "format.catalog", "load_catalog": "format.catalog",
    "CompiledFunnel": "funnel.compiled", "load_funnel": "funnel.compiled",
    "Completion": "llm.models", "Model": "llm.models", "ModelRequest": "llm.models",
    "ScriptedModel": "llm.models", "make_model": "llm.models",
    "FunnelSpec": "format.spec",
    "Store": "store", "open_store": "store",
    "SyncEngine": "sync",
    "Engine": "turn.engine", "TurnResult": "turn.engine",
    "Diagnostic": "validation", "validate_paths": "validation",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # once loaded, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__version__ = "0.1.0"

__all__ = [
    "ActionCall",
    "ActionOutcome",
    "ActionRefused",
    "Catalog",
    "CompiledFunnel",
    "Completion",
    "ConcurrentUpdate",
    "ConfigError",
    "Diagnostic",
    "Engine",
    "FunnelError",
    "FunnelInvalid",
    "FunnelSpec",
    "Model",
    "ModelError",
    "ModelRequest",
    "Product",
    "PromptTooLarge",
    "SchemaOutdated",
    "ScriptedModel",
    "Store",
    "StoreError",
    "StoreUnavailable",
    "SyncEngine",
    "TurnResult",
    "load_catalog",
    "load_funnel",
    "make_model",
    "open_store",
    "validate_paths",
]
