"""Authoring help: a new funnel folder scaffolded from a template (`funnel new`).

May import: `engine.validation`, `engine.format` and below.
"""
