"""The trust boundary: what crosses it is parsed strictly and bounded here, once.

`sanitize` bounds model output and JSON bodies (size, depth, characters);
`customer` bounds a customer's session id and message before anything runs.

May import: `engine.errors` only.
"""
