"""The public API is what `engine.__all__` says, no more, no less (as httpx pins it)."""

import subprocess
import sys

import engine

EXPECTED = {
    "ActionCall", "ActionOutcome", "ActionRefused", "Catalog", "CompiledFunnel", "Completion",
    "ConcurrentUpdate", "ConfigError", "Diagnostic", "Engine", "FunnelError", "FunnelInvalid",
    "FunnelSpec", "Model", "ModelError", "ModelRequest", "Product",
    "PromptTooLarge", "SchemaOutdated", "ScriptedModel", "Store", "StoreError",
    "StoreUnavailable", "SyncEngine", "TurnResult", "load_catalog",
    "load_funnel", "make_model", "open_store", "validate_paths",
}


def test_all_is_pinned() -> None:
    assert set(engine.__all__) == EXPECTED
    for name in engine.__all__:
        assert getattr(engine, name) is not None


def test_errors_share_one_root() -> None:
    from engine import errors

    for name in errors.__all__:
        obj = getattr(errors, name)
        if isinstance(obj, type):
            assert issubclass(obj, engine.FunnelError)


def test_import_engine_does_not_import_litellm_or_psycopg() -> None:
    code = ("import sys, engine, engine.validate, engine.engine; "
            "print('litellm' in sys.modules, 'psycopg' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["False", "False"]
