"""Funnel versions (docs/versions.md): the version store's bundles (`bundle`), pinning a
session to the version it started with (`pinning`), and the declared state
migrations that move it to a newer one (`migrations`)."""

from .bundle import Bundle, LoadedVersion, bundle_of, compile_bundle
from .migrations import apply_step, migrate_row, steps_between
from .pinning import Versions

__all__ = ["Bundle", "LoadedVersion", "Versions", "apply_step", "bundle_of", "compile_bundle",
           "migrate_row", "steps_between"]
