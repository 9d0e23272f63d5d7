"""`funnel serve`: the HTTP service (Starlette on uvicorn).

- ``app``: the ASGI app and its factory ``create_app`` (routes, error bodies);
- ``models``: the typed request and response bodies; ``routes``: the route table's row
  (``Operation``); ``handlers``: the handlers and their table ``OPERATIONS``;
- ``core``: ``Service``, the funnels' engines on one shared store, a turn and its limits;
- ``config``: ``ServiceConfig`` from ``FUNNEL_*`` environment variables;
- ``auth``: API keys with scopes (and the funnels a key is limited to), signed widget
  session tokens;
- ``privacy``: a customer's erasure and export (scope ``erase``);
- ``limits``: 413 / 429 / 503 refusals; ``metrics``: Prometheus text;
- ``inbound``: delivery keys (``Idempotency-Key``) and the replay of a message seen before;
- ``telegram/``: the Telegram channel (updates, Bot API calls, the webhook and its outbox);
- ``readiness``: what ``/readyz`` checks and says;
- ``openapi``: the API document, generated from the table and the models;
- ``server``: the command; ``static/``: the web widget.

The engine core never imports this package; it needs the ``serve`` extra
(``pip install 'funnel-engine[serve]'``). See docs/service.md.

May import: `engine.scenarios`, `engine.sync` and everything below them; only
`engine.cli` imports it.
"""
