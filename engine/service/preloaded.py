"""Funnels compiled in `funnel serve`'s master before it forks its workers.

:func:`engine.service.server.preload` offers each compiled funnel here; a forked worker's
:class:`~engine.service.core.Service` takes the master's object, whose pages it then
shares, instead of compiling a copy of its own (bench/start.py --workers 2, figures in
docs/deploy.md). Only while the funnel's files still hold what it was compiled from: a
worker the supervisor replaces after an edit compiles the edit. Its own module, light
on purpose: the master must not import prometheus_client (engine.service.metrics) before
``PROMETHEUS_MULTIPROC_DIR`` is set.
"""

from __future__ import annotations

from pathlib import Path

from ..format.files import file_hashes, watched_files
from ..funnel.compiled import CompiledFunnel, load_funnel

__all__ = ["compiled_funnel", "share_compiled"]

# By resolved path: the files' hashes when it was compiled, and the compiled funnel.
_SHARED: dict[Path, tuple[dict[str, str], CompiledFunnel]] = {}


def share_compiled(compiled: CompiledFunnel) -> None:
    """Offer ``compiled`` to the services this process, and the processes it forks, will
    create for the same funnel file."""
    spec = compiled.spec
    _SHARED[Path(spec.path).resolve()] = (file_hashes(watched_files(spec)), compiled)


def compiled_funnel(path: str | Path) -> CompiledFunnel:
    """The shared compiled funnel of ``path`` if its files are unchanged, else a fresh
    :func:`~engine.funnel.compiled.load_funnel`."""
    shared = _SHARED.get(Path(path).resolve())
    if shared is not None and file_hashes(watched_files(shared[1].spec)) == shared[0]:
        return shared[1]
    return load_funnel(path)
