"""Conversation memory beyond the window: the rolling summary, observations, recall.

`summary` holds the tiers and the background summary job; `observations` the
observer and reflector of observational memory (seed 002's tier 3); `recall` semantic
recall, past messages of the session like the current one (tier 4).

May import: `engine.llm`, `engine.store`, `engine.format` and below.
"""
