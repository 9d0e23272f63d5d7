"""The sandbox: the only place where text a funnel author wrote is executed.

`templates` holds the bounded, sandboxed Jinja environment (work limits, a
loader confined to the funnel's project); `expressions` compiles the conditions
and derived fields of a funnel into callables on that environment; `patterns`
compiles and runs the regular expressions a funnel declares on RE2 (linear time;
refused when RE2 cannot run them). No `eval`.

May import: `engine.format`, `engine.errors`, `engine.boundary`.
"""
