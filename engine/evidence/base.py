"""`funnel replay --base FILE`: the funnel the sessions ran on, given as a file.

Inside the edited funnel's project it loads as any funnel. Outside it (a checkout of the
base commit in a temporary folder, say) its templates, schemas and catalog are resolved
beside it, as the project lays them out: the base's project is taken to be the folder
that holds it as the edited funnel's project holds the edited funnel (``funnels/x.yaml``
two levels down: the folder above ``funnels/``). A base whose files do not resolve there
either is a one-line error that says where it must be.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import FunnelError, InvalidInput, first_line
from ..format.paths import funnel_roots
from ..funnel.compiled import CompiledFunnel, load_funnel

__all__ = ["load_base"]


def load_base(path: str | Path, edited: CompiledFunnel) -> CompiledFunnel:
    """The ``--base`` funnel.

    Raises:
        InvalidInput: it does not load where it is, nor with its files beside it.
    """
    base = Path(os.path.realpath(path))
    if not base.is_file():
        raise InvalidInput(f"--base {path}: no such file")
    edited_path = Path(os.path.realpath(edited.spec.path))
    project = funnel_roots(edited_path)[0]
    try:
        return load_funnel(base)
    except FunnelError as exc:
        if base.is_relative_to(project):
            raise InvalidInput(f"--base {path}: {_problem(exc)}") from None
        problem = _problem(exc)
    # Outside the project: its project laid out as the edited funnel's is.
    depth = len(edited_path.relative_to(project).parts) - 1
    root = base.parents[depth] if depth < len(base.parents) else base.parent
    before = os.environ.get("FUNNEL_ROOT")
    # The roots come from the environment (engine.format.paths): widened for this load
    # only, in this process only, to the base's own folder tree.
    os.environ["FUNNEL_ROOT"] = os.pathsep.join(x for x in (before, str(root)) if x)
    try:
        return load_funnel(base)
    except FunnelError:
        raise InvalidInput(
            f"--base {path}: {problem}; a base outside the funnel's project "
            f"({project}) must keep its files where the project keeps them, under {root} "
            f"(e.g. a checkout of the base commit: `git worktree add DIR REF`, then --base "
            f"DIR/{edited_path.relative_to(project).as_posix()}), or sit inside the project"
        ) from None
    finally:
        if before is None:
            os.environ.pop("FUNNEL_ROOT", None)
        else:
            os.environ["FUNNEL_ROOT"] = before


def _problem(exc: FunnelError) -> str:
    errors = [d for d in getattr(exc, "diagnostics", None) or [] if d.severity == "error"]
    if errors:
        d = errors[0]
        return first_line(Exception(f"{d.file}:{d.line}: {d.message}"))
    return first_line(exc)
