"""Funnel versions (docs/versions.md): the version store's bundles (`bundle`), pinning a
session to the version it started with (`pinning`), and deploying from the command line
(`deploy`). The declared state migrations that move a session to a newer version are part
of the format (`engine.format.migrations`), so that `engine.validation` can apply them
without importing the compiled funnel (which imports validation); this namespace
re-exports them.

May import: `engine.store`, `engine.funnel` and below; never the turn.
"""

from ..format.migrations import apply_step, migrate_row, steps_between

__all__ = ["apply_step", "migrate_row", "steps_between"]
