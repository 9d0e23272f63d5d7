"""Conversation memory beyond the window: the rolling summary and observations.

`summary` holds the tiers and the background summary job; `observations` the
observer and reflector of observational memory (seed 002's tier 3).

May import: `engine.llm`, `engine.store`, `engine.format` and below.
"""
