"""The public API is what `engine.__all__` says, no more, no less (as httpx pins it)."""

import subprocess
import sys
from pathlib import Path

import engine

ROOT = Path(__file__).resolve().parent.parent

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


# What a turn tells the caller: a field removed or renamed breaks every integration.
TURN_RESULT_FIELDS = (
    "session_id", "reply", "stage_before", "stage_after", "state", "transitions", "actions",
    "updated", "notices", "validation_failures", "repaired", "fallback", "prompt_tokens",
    "completion_tokens", "cached_prompt_tokens", "cache_write_tokens", "handoff", "returning",
    "error", "backlog", "message_id", "model_seconds", "explain", "held", "approval",
    "recalled", "refused_claims", "reply_claims",
)


def test_turn_result_fields_are_pinned() -> None:
    import dataclasses

    assert tuple(f.name for f in dataclasses.fields(engine.TurnResult)) == TURN_RESULT_FIELDS
    # Of the prompt tokens, those read from the provider's cache: 0 unless one says so.
    result = engine.TurnResult(session_id="s", reply="r", stage_before="a", stage_after="a",
                               state={})
    assert result.cached_prompt_tokens == 0
    assert result.cache_write_tokens == 0  # and those written to it


def test_errors_share_one_root() -> None:
    from engine import errors

    records = set()
    for name in errors.__all__:
        obj = getattr(errors, name)
        if isinstance(obj, type) and issubclass(obj, BaseException):
            assert issubclass(obj, engine.FunnelError)
        else:
            records.add(name)
    # what the module holds besides the tree: the diagnostic FunnelInvalid carries, and the
    # helpers that write the messages' suggestions
    assert records == {"Diagnostic", "closest", "did_you_mean", "first_line"}


def test_import_engine_does_not_import_litellm_or_psycopg() -> None:
    code = ("import sys, engine, engine.validation, engine.turn.engine; "
            "print('litellm' in sys.modules, 'psycopg' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["False", "False"]


def _modules_after(command: str) -> set[str]:
    """The modules loaded by running `funnel <command>` in a fresh interpreter."""
    code = ("import sys\nfrom engine.cli import main\n"
            f"status = main({command.split()!r})\n"
            "print('\\n'.join(sorted(sys.modules)), file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, check=False)
    return set(done.stderr.split())


def test_funnel_validate_loads_neither_the_machine_nor_the_store() -> None:
    loaded = _modules_after("validate funnels/")
    assert "engine.validation.runner" in loaded  # it did validate
    heavy = {m for m in loaded if m.split(".")[0] in ("transitions", "psycopg", "litellm")
             or m.startswith(("engine.store", "engine.turn.engine", "engine.funnel.machine"))}
    assert not heavy, sorted(heavy)

