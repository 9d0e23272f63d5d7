"""funnel: run LLM sales conversations as finite-state machines declared in YAML.

The LLM proposes; code decides. Load a funnel once, then hand each customer
message to :meth:`Engine.handle`::

    from engine import Engine

    engine = await Engine.open("funnels/puramur.yaml", model="gpt-4o-mini")
    result = await engine.handle("session-1", "Hi! I have a Sphynx cat")
    print(result.reply, result.stage_after)
"""

from .actions import ActionCall, ActionOutcome
from .catalog import Catalog, Product, load_catalog
from .diagnostics import Diagnostic
from .engine import Engine, TurnResult
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
from .funnel import CompiledFunnel, load_funnel
from .models import Completion, Model, ModelRequest, ScriptedModel, make_model
from .spec import FunnelSpec
from .store import Store, open_store
from .sync import SyncEngine
from .validate import validate_paths

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
