"""The funnel format: what a funnel file declares, read and checked for shape.

Holds the typed declaration (`spec`, with the model, memory, language and
knowledge `settings`; `build` makes it of a file's data), the YAML reader that
keeps line numbers (`_yaml`), the engine's fixed names (`names`), the project
confinement of files (`paths`), the catalog (`catalog`), an A/B experiment's
declaration (`experiment`), the
declared state migrations between versions (`migrations`), the main path and side
branches of the stages (`main_path`), the phone numbers of
`format: phone` fields (`phones`, libphonenumber's rules), the personal and grounded
marks of state fields (`personal`), the customer's words as grounding compares them
(`words`: folding, look-alikes, case endings and function words per language, from
``engine/data/words.yaml``) and the texts the engine sends a customer, by language,
with its own in uk, ru, en and pl (`texts`).

May import: `engine.errors`, `engine.boundary`, `engine.records`. Nothing here
compiles a funnel or touches a database.
"""
