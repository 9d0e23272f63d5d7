"""F208: a template loop laid out one item per line whose output has no line break.

The sandbox trims blocks (``trim_blocks``): the newline right after ``{% endif %}`` or
``{% endfor %}`` is eaten. A loop written over several lines, one item per line, whose
every line ends in a block tag renders its items run together ("277 UAH- PR251020 ...").
The parsed template already has the trimming applied, so the check reads it there.
"""

from __future__ import annotations

from collections.abc import Iterator

from jinja2 import nodes


def run_together_loops(tree: nodes.Template) -> Iterator[tuple[int, str]]:
    """(line, message) of every multi-line ``{% for %}`` whose body outputs no newline."""
    for loop in tree.find_all(nodes.For):
        body = [n for n in loop.body]
        lines = {n.lineno for top in body for n in (top, *top.find_all(nodes.Node))}
        if not lines or max(lines) <= loop.lineno:
            continue  # written on one line: a list run together on purpose
        if not any(isinstance(n, nodes.Output) and n.nodes for n in body):
            continue
        texts = [d.data for top in body for d in top.find_all(nodes.TemplateData)]
        if any("\n" in t for t in texts):
            continue
        yield loop.lineno, (
            "the loop is laid out one item per line, but its output has no line break: block "
            "tags eat the newline after them (`{% endif %}`, `{% endfor %}`), so the items run "
            "together; end the item's line with an expression (`{{ ' (gift)' if x else '' }}`) "
            "or close the block with `+%}` (`{% endif +%}`) to keep its newline")
