"""The Telegram channel: one bot per funnel, answered through the outbox.

Telegram POSTs each update to ``/v1/funnels/{funnel}/telegram`` with the
secret token given to ``setWebhook`` in ``X-Telegram-Bot-Api-Secret-Token``;
anything else is refused with 401.

- ``updates``: an ``Update`` parsed strictly (private chats, groups when the
  funnel opts in, forum topics, ``/start PAYLOAD``, callback queries);
- ``botapi``: Bot API calls and what a refusal means (429 ``retry_after``, 5xx,
  403 blocked);
- ``channel``: the webhook (acknowledged within a second, once the message and
  its delivery key are committed), the turn in the background, the reply as an
  outbox row delivered in order with retries, and the sweep that answers what a
  dead worker accepted.
"""

from .channel import POLITE, TelegramChannel
from .updates import SESSION_PREFIX, Incoming, parse

__all__ = ["POLITE", "SESSION_PREFIX", "Incoming", "TelegramChannel", "parse"]
