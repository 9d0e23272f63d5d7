"""Which compiled funnel a session's turn runs on: its version, then its variant.

The one place where a session meets a funnel (``Engine._start``): pinning picks the
version (``engine.versions``, docs/versions.md: the session's own while it is open,
else the newest), the experiment picks the variant of that version
(``engine.experiments``, docs/experiments.md), and a row that changes version is moved
by the declared migrations. The turn's steps then read ``turn.funnel`` only.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from ..experiments.router import Variants
from ..funnel.compiled import CompiledFunnel
from ..store import Store
from ..versions.pinning import Versions

__all__ = ["Routing"]


class Routing:
    """The versions an engine holds and each one's experiment variants, compiled once."""

    def __init__(self, newest: CompiledFunnel, store: Store, *, deploy: bool = True) -> None:
        # ``deploy``: the versions taken here are the ones pinned sessions load; else they
        # are stored as trials (engine.versions.pinning).
        self.versions = Versions(newest, store, deploy=deploy)
        # The newest version's experiment; an older version's variants are compiled when
        # a session pinned to it comes back.
        self.variants = Variants.for_funnel(newest)
        # Keyed by id(): the pair holds the funnel, so the id cannot be reused meanwhile.
        self._variants_of: dict[int, tuple[CompiledFunnel, Variants]] = {
            id(newest): (newest, self.variants)}

    async def prepare(self, row: Mapping[str, Any] | None) -> None:
        """Load the version a pinned session's row names from the version store."""
        await self.versions.prepare(row)

    def choose(self, session_id: str, row: Mapping[str, Any] | None,
               now: datetime) -> CompiledFunnel:
        """The version (pinning) and then the session's variant of it."""
        funnel = self.versions.choose(row, now)
        held = self._variants_of.get(id(funnel))
        if held is None or held[0] is not funnel:
            held = self._variants_of[id(funnel)] = (funnel, Variants.for_funnel(funnel))
        return held[1].funnel_for(session_id, row)

    def move(self, session_id: str, row: dict[str, Any], funnel: CompiledFunnel
             ) -> tuple[CompiledFunnel, dict[str, Any], dict[str, Any] | None]:
        """The row moved to ``funnel``'s version by the declared migrations (see
        :meth:`engine.versions.pinning.Versions.move`)."""
        return self.versions.move(session_id, row, funnel)

    async def deploy(self, funnel: CompiledFunnel) -> None:
        """Make ``funnel`` the newest version, its experiment compiled first.

        Raises:
            ConfigError: its experiment is invalid (nothing changes).
        """
        variants = Variants.for_funnel(funnel)
        await self.versions.store_newest(funnel)
        self.variants = variants
        self._variants_of[id(funnel)] = (funnel, variants)

    def digest_of(self, funnel: CompiledFunnel) -> str | None:
        """The content hash of the copy a turn on ``funnel`` (a version, or a variant of
        it) runs on: what its turn record keeps."""
        return self.versions.digest_of(funnel.spec.version)

    def loaded(self) -> dict[int, str]:
        """``{version: content hash}`` of the versions compiled here."""
        return self.versions.loaded()

    def close(self) -> None:
        self.versions.close()
