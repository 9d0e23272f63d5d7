"""`funnel validate`: every problem in a funnel, found in one run.

`runner` reads the file and calls each checker in turn: `format` (the format's
JSON Schema), `semantics` (names, the stage graph, conditions, indexes),
`actions` (builtins, hooks, `on_enter`), `grounding` (`grounded:` marks and `confirm:`
phrases), `files` (templates, output schemas, the catalog, and with it `cart`: a cart
total its column cannot hold), `texts` (the texts a customer gets instead of the
model's, by language) and `storage` (names shared by funnels validated together). They
write into one `diagnostics.Report`.

Importing this package imports neither litellm, psycopg nor `transitions`.

May import: `engine.sandbox`, `engine.format`, `engine.boundary`, `engine.errors`; it
never compiles a funnel (`engine.funnel` imports it).
"""

from .diagnostics import Diagnostic, Report, Severity, render
from .format import format_schema, packaged_validator
from .runner import check_file, check_text, discover, validate_paths

__all__ = [
    "Diagnostic",
    "Report",
    "Severity",
    "check_file",
    "check_text",
    "discover",
    "format_schema",
    "packaged_validator",
    "render",
    "validate_paths",
]
