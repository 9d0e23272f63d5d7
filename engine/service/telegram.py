"""The Telegram webhook: one bot per funnel, chat id -> session ``tg-<chat_id>``.

Telegram POSTs each update to ``/v1/funnels/{funnel}/telegram`` with the
secret token given to ``setWebhook`` in ``X-Telegram-Bot-Api-Secret-Token``;
anything else is refused with 401. A text message (or a photo's caption, or a
shared contact) is one turn, answered through the Bot API's ``sendMessage``.
Stickers, photos, voice notes and edited messages get a polite note instead
of a turn. Telegram re-sends an update that got no 2xx, so a 503 (database
down, session busy) loses nothing; an update answered once is not answered
again when it comes back.
"""

from __future__ import annotations

import hmac
import logging
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .config import TelegramBot
from .limits import MAX_UPDATE_BYTES, RequestRefused, error, read_json

if TYPE_CHECKING:
    from .core import Service

log = logging.getLogger("funnel.service.telegram")

SESSION_PREFIX = "tg-"
POLITE = {
    "sticker": "Nice sticker! I can only read text, though: tell me in words how I can help.",
    "photo": "Thank you for the photo! I can't see pictures yet; please describe it in a message.",
    "media": "I can only read text messages; please write to me what you need.",
    "edited": "I see you edited a message. I only read new ones, so please send the "
              "correction as a new message.",
}
_MEDIA = ("voice", "audio", "video", "video_note", "document", "animation", "location",
          "venue", "poll", "dice", "game")
_MESSAGE_KEYS = ("message", "edited_message")
_SEEN_MAX = 10_000


def classify(update: dict[str, Any]) -> tuple[str, int | str | None, str | None]:
    """(kind, chat id, text for a turn). Kinds: text, caption, contact, sticker, photo,
    media, edited, ignored."""
    edited = update.get("edited_message")
    if isinstance(edited, dict):
        return "edited", _chat_id(edited), None
    message = update.get("message")
    if not isinstance(message, dict):
        return "ignored", None, None  # callback queries, chat member updates, channel posts
    chat = _chat_id(message)
    sender = message.get("from")
    if chat is None or (isinstance(sender, dict) and sender.get("is_bot")):
        return "ignored", None, None
    text = message.get("text")
    if isinstance(text, str) and text.strip():
        return "text", chat, text
    caption = message.get("caption")
    if isinstance(caption, str) and caption.strip():
        return "caption", chat, caption
    contact = message.get("contact")
    if isinstance(contact, dict) and contact.get("phone_number"):
        name = " ".join(str(contact[k]) for k in ("first_name", "last_name") if contact.get(k))
        return "contact", chat, f"{name}, {contact['phone_number']}".strip(", ")
    if "sticker" in message:
        return "sticker", chat, None
    if "photo" in message:
        return "photo", chat, None
    if any(k in message for k in _MEDIA):
        return "media", chat, None
    return "ignored", None, None  # joins, pins and other service messages


def _chat_id(message: dict[str, Any]) -> int | str | None:
    chat = message.get("chat")
    cid = chat.get("id") if isinstance(chat, dict) else None
    return cid if isinstance(cid, int | str) and str(cid).lstrip("-").isdigit() else None


class TelegramChannel:
    """Webhook handling and Bot API calls for every funnel that has a bot."""

    def __init__(self, service: Service, api: str) -> None:
        self.service = service
        self.api = api.rstrip("/")
        self.http: httpx.AsyncClient | None = None
        self._seen: dict[str, OrderedDict[int, None]] = {}

    async def start(self) -> None:
        self.http = httpx.AsyncClient(timeout=httpx.Timeout(10.0, connect=5.0))

    async def close(self) -> None:
        if self.http is not None:
            await self.http.aclose()

    async def webhook(self, request: Request, funnel: str) -> Response:
        bot = self.service.config.telegram_bot(funnel)
        if bot is None:
            return error(404, "not_found", f"funnel '{funnel}' has no Telegram bot configured")
        given = request.headers.get("x-telegram-bot-api-secret-token", "")
        if not hmac.compare_digest(given.encode("utf-8", "replace"), bot.secret.encode()):
            self.service.metrics.refused(funnel, "unauthorized")
            return error(401, "unauthorized", "wrong or missing X-Telegram-Bot-Api-Secret-Token")
        try:
            update = await read_json(request, MAX_UPDATE_BYTES)
        except RequestRefused as exc:
            return exc.response()
        if not isinstance(update, dict) or type(update.get("update_id")) is not int or any(
                k in update and not isinstance(update[k], dict) for k in _MESSAGE_KEYS):
            return error(400, "bad_request", "not a Telegram update: an object with an integer "
                         "`update_id` and, if any, an object `message` / `edited_message`")
        update_id: int = update["update_id"]
        seen = self._seen.setdefault(funnel, OrderedDict())
        if update_id in seen:
            return JSONResponse({"ok": True, "duplicate": True})
        kind, chat, text = classify(update)
        self.service.metrics.count("funnel_telegram_updates_total", funnel=funnel, kind=kind)
        if kind != "ignored" and chat is not None:
            if text is not None:
                try:
                    result = await self.service.converse(funnel, f"{SESSION_PREFIX}{chat}", text,
                                                         channel="telegram")
                except RequestRefused as exc:
                    return exc.response()  # a 503 makes Telegram send the update again
                reply = result.reply
            else:
                reply = POLITE[kind]
            await self.send(bot, funnel, chat, reply)
        seen[update_id] = None
        while len(seen) > _SEEN_MAX:
            seen.popitem(last=False)
        return JSONResponse({"ok": True})

    async def send(self, bot: TelegramBot, funnel: str, chat: int | str, text: str) -> bool:
        """``sendMessage``; a failure is logged (never with the token) and counted."""
        assert self.http is not None, "TelegramChannel.start() was not called"
        url = f"{self.api}/bot{bot.token}/sendMessage"
        try:
            response = await self.http.post(url, json={"chat_id": chat, "text": text[:4096]})
            ok = response.status_code == 200 and bool(response.json().get("ok"))
            problem = f"HTTP {response.status_code}"
        except (httpx.HTTPError, ValueError) as exc:
            ok, problem = False, type(exc).__name__  # str(exc) may quote the URL and its token
        if not ok:
            self.service.metrics.count("funnel_telegram_send_errors_total", funnel=funnel)
            log.warning("telegram sendMessage for funnel %s failed: %s", funnel, problem)
        return ok
