"""A funnel compiled once: the stage machine, the state rules, the actions.

`compiled` validates a funnel file and builds a
:class:`~engine.funnel.compiled.CompiledFunnel` once per funnel: its
`transitions` machine (`machine`), the state's derived fields, completeness and
field checks (`state`), and the declared actions with their hooks (`actions`).
A turn binds a session to it; nothing here holds a session.

May import: `engine.validation`, `engine.sandbox`, `engine.format` and below.
"""
