"""Records that both the store and the turn hold, so that neither imports the other.

`messages` (a conversation's :class:`~engine.records.messages.Message` and the
token estimate), `orders` (orders and conversions, parsed and bounded),
`explanation` (the stored form of a turn's explanation), `chunks` (a
knowledge chunk) and `calls` (one HTTP call to a model, as the turn record lists it).

May import: `engine.errors` only.
"""
