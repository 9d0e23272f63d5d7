"""Telegram ``Update`` objects, parsed strictly: what arrived, from whom, and whether it
is for this bot.

Private chats are the default. A group (or supergroup) is served only when the
funnel opts in (``FUNNEL_TELEGRAM_GROUPS_<NAME>=1``), then with one session per
member (``tg-<chat>-<user>``) and only for messages addressed to the bot: a
mention of it, a reply to one of its messages, or a command without a bot name
or with its own (``/price@this_bot``; ``/report@other_bot`` is not ours). A forum
topic's ``message_thread_id`` is kept so the reply lands in the topic. ``/start
PAYLOAD`` (a deep link) is kept as attribution; the model sees only ``/start``.

Every update crosses the customer boundary here, in :func:`parse` (the same bounds
as the API's and the widget's, ``engine.boundary.customer``): a text, caption or
contact that holds a NUL or a lone surrogate is the kind ``unusable``, which the
channel answers 200 (so that Telegram stops sending it) and counts, with no turn.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from ...boundary.customer import check_input
from ...errors import InvalidInput

SESSION_PREFIX = "tg-"
_MEDIA = ("voice", "audio", "video", "video_note", "document", "animation", "location",
          "venue", "poll", "dice", "game")
# https://core.telegram.org/bots/features#deep-linking: up to 64 of A-Z a-z 0-9 _ -
_START_PAYLOAD = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_GROUPS = ("group", "supergroup")


@dataclass(frozen=True)
class Incoming:
    """One update, as the channel acts on it.

    Kinds: ``text``, ``caption``, ``contact``, ``start`` (a turn); ``sticker``,
    ``photo``, ``media``, ``edited`` (a polite note, no turn); ``callback`` (answered,
    no turn); ``member`` (the bot was added or blocked), ``not_addressed`` (a group
    message for someone else), ``group`` (groups are off), ``unusable`` (text the
    engine cannot take: a NUL, a lone surrogate), ``ignored``.
    """

    kind: str
    chat_id: int | None = None
    chat_type: str | None = None
    user_id: int | None = None
    text: str | None = None
    thread_id: int | None = None
    message_id: int | None = None
    start_payload: str | None = None
    callback_id: str | None = None
    sender_name: str | None = None  # who pressed a button: the name Telegram shows

    @property
    def group(self) -> bool:
        return self.chat_type in _GROUPS

    @property
    def session_id(self) -> str:
        if self.group:
            return f"{SESSION_PREFIX}{self.chat_id}-{self.user_id}"
        return f"{SESSION_PREFIX}{self.chat_id}"

    def reply_to(self) -> dict[str, Any]:
        """Where the reply goes: the outbox row's fields besides ``text``."""
        target: dict[str, Any] = {"chat_id": self.chat_id}
        if self.thread_id is not None:
            target["message_thread_id"] = self.thread_id
        if self.group and self.message_id is not None:
            target["reply_to_message_id"] = self.message_id  # who is answered, in a group
        return target


def _int(value: Any) -> int | None:
    return value if type(value) is int else None


def _message_parts(message: dict[str, Any]) -> tuple[int | None, str | None, int | None]:
    chat = message.get("chat")
    chat = chat if isinstance(chat, dict) else {}
    sender = message.get("from")
    user = _int(sender.get("id")) if isinstance(sender, dict) else None
    cid, kind = _int(chat.get("id")), chat.get("type")
    if kind is None and cid is not None and cid > 0:
        kind = "private"  # older payloads (the Bot API docs' own samples) omit the type
    return cid, kind if isinstance(kind, str) else None, user


def parse(update: dict[str, Any], *, bot_id: int | None, username: str | None,
          groups: bool) -> Incoming:
    """What ``update`` is, for the bot ``bot_id`` (``@username``); never raises."""
    incoming = _parse(update, bot_id=bot_id, username=username, groups=groups)
    if incoming.text is not None:
        try:
            check_input(incoming.session_id, incoming.text)
        except InvalidInput:
            return Incoming("unusable", incoming.chat_id, incoming.chat_type, incoming.user_id)
    return incoming


def _parse(update: dict[str, Any], *, bot_id: int | None, username: str | None,
           groups: bool) -> Incoming:
    callback = update.get("callback_query")
    if isinstance(callback, dict):
        cid = callback.get("id")
        message = callback.get("message")
        chat, chat_type, _ = _message_parts(message) if isinstance(message, dict) else (
            None, None, None)
        sender = callback.get("from")
        sender = sender if isinstance(sender, dict) else {}
        data, name = callback.get("data"), sender.get("username") or sender.get("first_name")
        return Incoming("callback", chat, chat_type, user_id=_int(sender.get("id")),
                        text=data if isinstance(data, str) and len(data) <= 64 else None,
                        callback_id=cid if isinstance(cid, str) and cid else None,
                        sender_name=name[:80] if isinstance(name, str) else None)
    if isinstance(update.get("my_chat_member"), dict):
        return Incoming("member")
    edited = update.get("edited_message")
    if isinstance(edited, dict):
        chat, chat_type, user = _message_parts(edited)
        if chat is None or chat_type != "private":
            return Incoming("ignored")
        return Incoming("edited", chat, chat_type, user)
    message = update.get("message")
    if not isinstance(message, dict):
        return Incoming("ignored")  # channel posts, polls, chat member updates, ...
    chat, chat_type, user = _message_parts(message)
    sender = message.get("from")
    if chat is None or user is None or (isinstance(sender, dict) and sender.get("is_bot")):
        return Incoming("ignored")
    thread = _int(message.get("message_thread_id")) if message.get("is_topic_message") else None
    base = Incoming("ignored", chat, chat_type, user, thread_id=thread,
                    message_id=_int(message.get("message_id")))
    if chat_type in _GROUPS:
        if not groups:
            return replace(base, kind="group")
        if not _addressed(message, bot_id, username):
            return replace(base, kind="not_addressed")
    elif chat_type != "private":
        return Incoming("ignored")
    text = message.get("text")
    if isinstance(text, str) and text.strip():
        command, _, rest = text.strip().partition(" ")
        if command.split("@")[0] == "/start":
            payload = rest.strip()
            return replace(base, kind="start", text="/start", start_payload=payload if
                           _START_PAYLOAD.fullmatch(payload) else None)
        if username:
            text = re.sub(rf"@{re.escape(username)}\b", "", text, flags=re.I).strip() or text
        return replace(base, kind="text", text=text)
    caption = message.get("caption")
    if isinstance(caption, str) and caption.strip():
        return replace(base, kind="caption", text=caption)
    contact = message.get("contact")
    if isinstance(contact, dict) and contact.get("phone_number"):
        name = " ".join(str(contact[k]) for k in ("first_name", "last_name") if contact.get(k))
        return replace(base, kind="contact", text=f"{name}, {contact['phone_number']}".strip(", "))
    if "sticker" in message:
        return replace(base, kind="sticker")
    if "photo" in message:
        return replace(base, kind="photo")
    if any(k in message for k in _MEDIA):
        return replace(base, kind="media")
    return Incoming("ignored")  # joins, pins and other service messages


def _addressed(message: dict[str, Any], bot_id: int | None, username: str | None) -> bool:
    """A group message is ours if it mentions the bot, replies to it, or is a command for
    it (no bot name, or ours)."""
    replied = message.get("reply_to_message")
    if isinstance(replied, dict):
        author = replied.get("from")
        if isinstance(author, dict) and bot_id is not None and author.get("id") == bot_id:
            return True
    text = message.get("text") or message.get("caption")
    entities = message.get("entities") or message.get("caption_entities")
    if not isinstance(text, str) or not isinstance(entities, list):
        return False
    name = (username or "").lower()
    for entity in entities[:100]:
        if not isinstance(entity, dict):
            continue
        kind, offset, length = entity.get("type"), entity.get("offset"), entity.get("length")
        if type(offset) is not int or type(length) is not int:
            continue
        # Offsets count UTF-16 code units.
        piece = text.encode("utf-16-le")[2 * offset:2 * (offset + length)].decode(
            "utf-16-le", "replace")
        if kind == "bot_command" and offset == 0:
            _, at, target = piece.partition("@")
            if not at or (name and target.lower() == name):
                return True
        elif kind == "mention" and name and piece.lower() == f"@{name}":
            return True
        elif kind == "text_mention":
            user = entity.get("user")
            if isinstance(user, dict) and bot_id is not None and user.get("id") == bot_id:
                return True
    return False
