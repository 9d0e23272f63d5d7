"""Hooks: code a funnel names (``module:function``), run where it cannot freeze a worker.

Which modules a funnel may name: a ``<module>.py`` beside the funnel file (the
usual place, reloaded when its file changes), or a module installed on the
Python path that is neither part of the standard library nor of the engine
itself. ``hook: sys:exit``, ``os:system`` or ``subprocess:run`` are refused by
`funnel validate` (F506) and by the load: a funnel's author writes a funnel, not
a shell. An installed module is imported once per process and never reloaded
(restart the service after editing one); a module beside the funnel is executed
again whenever its content changed (its bytes, not its size and mtime: an edit that
keeps both, or restores the mtime, is still an edit), so that a reload of the funnel
(a file change, SIGHUP) runs the new code.

A hook runs in a thread of its own (:func:`call_off_loop`), never on the event
loop: a hook that sleeps delays its own turn, not every session of the worker,
and it is given at most the turn's deadline. Its threads are daemons: a hook that
never returns does not keep the process alive at shutdown. Whatever a hook raises
(``SystemExit``, ``KeyboardInterrupt`` and ``asyncio.CancelledError`` included)
arrives as an ordinary exception (:class:`HookFailed`), so the turn's own
failure path handles it.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import importlib.util
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from ..errors import ConfigError, HookFailed, HookTimeout
from ..format.names import refused_hook_module

__all__ = ["HOOK_THREADS", "call_off_loop", "import_hook_module"]

T = TypeVar("T")

# At most this many hook threads at once per process: a hook that never returns holds
# one; when all are held, further hooks fail at once (their turns answer with the
# fallback) instead of queueing without end.
HOOK_THREADS = 16
_SLOTS = threading.BoundedSemaphore(HOOK_THREADS)


# Modules beside a funnel, by file: the SHA-256 of the version executed, and the module.
_LOCAL: dict[Path, tuple[str, Any]] = {}
_LOCAL_LOCK = threading.Lock()


def import_hook_module(module_name: str, base: Path) -> Any:
    """The module ``module_name`` as a funnel in ``base`` names it (see the module doc).

    Raises:
        ConfigError: a module the funnel may not name (standard library, the engine).
        ImportError, SyntaxError, or what the module raises while it runs.
    """
    local = (base / (module_name.replace(".", "/") + ".py")).resolve()
    if not local.exists():
        why = refused_hook_module(module_name)
        if why is not None:
            raise ConfigError(f"hook module {why}")
        return importlib.import_module(module_name)
    source = local.read_bytes()  # read at a funnel's load only, never in a turn
    version = hashlib.sha256(source).hexdigest()
    with _LOCAL_LOCK:
        known = _LOCAL.get(local)
        if known is not None and known[0] == version:
            return known[1]
        key = f"_funnel_hooks_{abs(hash(str(local)))}_{module_name}"
        spec = importlib.util.spec_from_file_location(key, local)
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        # Registered while it runs (a dataclass in it looks itself up), and taken
        # back when it fails: a half-run module must not be found by the next load.
        previous = sys.modules.get(key)
        sys.modules[key] = module
        try:
            # The bytes hashed, not the file read again: what runs is what was compared.
            exec(compile(source, str(local), "exec"), module.__dict__)
        except BaseException:
            if previous is None:
                del sys.modules[key]
            else:
                sys.modules[key] = previous
            raise
        _LOCAL[local] = (version, module)
        return module


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


async def call_off_loop(fn: Callable[..., T], *args: Any, timeout: float, what: str) -> T:
    """``fn(*args)`` in a daemon thread, awaited for at most ``timeout`` seconds.

    An ``Exception`` it raises is raised here as it is; anything else
    (``SystemExit``, ``KeyboardInterrupt``, ``CancelledError``) as :class:`HookFailed`.

    Raises:
        HookTimeout: ``fn`` did not return in time (the thread is left to finish on
            its own: Python cannot stop it), or every hook thread is busy.
    """
    if not _SLOTS.acquire(blocking=False):
        raise HookTimeout(f"{what}: all {HOOK_THREADS} hook threads are busy with hooks "
                          "that have not returned; fix the hook that hangs")
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def work() -> None:
        result: Any = None
        error: BaseException | None = None
        try:
            result = fn(*args)
        except Exception as exc:
            error = exc
        except BaseException as exc:  # the hook's own SystemExit etc.: not a signal
            error = HookFailed(f"{what} raised {_describe(exc)}")
        finally:
            _SLOTS.release()
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:  # the loop closed meanwhile (shutdown): nobody waits
            pass

    threading.Thread(target=work, name="funnel-hook", daemon=True).start()
    try:
        return await asyncio.wait_for(asyncio.shield(future), timeout)
    except TimeoutError:
        raise HookTimeout(f"{what} did not return within {timeout:g} s (the turn's "
                          "deadline); it runs on in its thread, its result is dropped"
                          ) from None
