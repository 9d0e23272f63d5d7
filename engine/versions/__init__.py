"""Funnel versions (docs/versions.md): the version store's bundles (`bundle`), pinning a
session to the version it started with (`pinning`), the declared state migrations that
move it to a newer one (`migrations`), and deploying from the command line (`deploy`).

This package's own namespace holds only the pure migrations, so that `engine.validation`
can apply them without importing the compiled funnel (which imports validation).
"""

from ..format.migrations import apply_step, migrate_row, steps_between

__all__ = ["apply_step", "migrate_row", "steps_between"]
