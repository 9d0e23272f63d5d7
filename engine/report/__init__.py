"""`funnel report`: where conversations go, how long they take, what they cost.

`build` runs the report's queries (`engine.store.analytics_sql`, computed on
the database) and shapes the rows, then renders them as aligned tables or
JSON; `html` renders the self-contained HTML page.

May import: `engine.store`, `engine.experiments`, `engine.funnel` and below; never the
turn.
"""

from .build import SECTIONS, build_report, render_json, render_table
from .html import render_html

__all__ = ["SECTIONS", "build_report", "render_html", "render_json", "render_table"]
