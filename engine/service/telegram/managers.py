"""The managers' Telegram chat: hand-off alerts with buttons that take the session over
and hand it back (``FUNNEL_TELEGRAM_MANAGER_CHAT_<NAME>``).

A hand-off alert is one more target of the funnel's notifier (``telegram``),
delivered and retried by the outbox like the others: a message to the managers'
chat naming the session, the reason and the customer, with two inline buttons,
*Take over* and *Back to the bot* (an approval gate's alert, engine.turn.approval:
*Approve* and *Reject*). A press in that chat (and only there: the chat is
who may manage) runs engine.turn.manager's take-over or release under the manager's
Telegram name, and the button answers with what happened.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ...errors import FunnelError, InvalidInput
from ...turn import manager
from ...turn.notify import Notifier
from ..config import TelegramBot
from ..limits import RequestRefused
from .botapi import MAX_TEXT, BotApi
from .updates import Incoming

if TYPE_CHECKING:
    from ..core import Service

log = logging.getLogger("funnel.service.telegram")

MAX_CALLBACK_DATA = 64  # bytes (Bot API: InlineKeyboardButton.callback_data)
_PRESS = re.compile(r"^(takeover|release|approve|reject):(.+)$")
_HAND_OFF = (("takeover", "Take over"), ("release", "Back to the bot"))
_APPROVAL = (("approve", "Approve"), ("reject", "Reject"))


def buttons(session_id: str, approval: bool = False) -> dict[str, Any] | None:
    """The alert's inline keyboard (an approval's: *Approve* / *Reject*); None when the
    session id is too long for a button."""
    rows = [{"text": label, "callback_data": f"{action}:{session_id}"}
            for action, label in (_APPROVAL if approval else _HAND_OFF)]
    if any(len(b["callback_data"].encode()) > MAX_CALLBACK_DATA for b in rows):
        return None
    return {"inline_keyboard": [rows]}


def alert(api: BotApi, bot: TelegramBot) -> Notifier:
    """The ``telegram`` target of a hand-off alert: the managers' chat, with buttons."""
    async def send(payload: Mapping[str, Any]) -> None:
        session = str(payload.get("session_id", ""))
        customer = payload.get("customer") or {}
        who = ", ".join(f"{k}: {v}" for k, v in customer.items() if v) if isinstance(
            customer, dict) else ""
        approval = payload.get("event") == "approval"
        if approval:  # a move that waits for a manager (engine.turn.approval)
            text = (f"Approval needed in {payload.get('funnel')}: session {session} "
                    f"({payload.get('channel')}) moving from {payload.get('stage')} to "
                    f"{payload.get('to')}, reason: {payload.get('reason') or 'unspecified'}; "
                    f"by {payload.get('deadline')}, else {payload.get('on_timeout')}")
        else:
            text = (f"Hand-off in {payload.get('funnel')}: session {session} "
                    f"({payload.get('channel')}), reason: "
                    f"{payload.get('reason') or 'unspecified'}")
        cart = payload.get("cart")
        if approval and isinstance(cart, dict) and cart.get("total") is not None:
            text += f"\nCart total: {cart['total']}"
        text += f"\nCustomer: {who}" if who else ""
        body: dict[str, Any] = {"chat_id": bot.manager_chat, "text": text[:MAX_TEXT]}
        keyboard = buttons(session, approval)
        if keyboard is not None:
            body["reply_markup"] = keyboard
        result = await api.call(bot.token, "sendMessage", body)
        if not result.ok:
            raise RuntimeError(f"Telegram sendMessage to the managers' chat: {result.problem}")

    return send


async def pressed(service: Service, api: BotApi, funnel: str, bot: TelegramBot,
                  incoming: Incoming) -> None:
    """Answer a button press: run it when it came from the managers' chat."""
    text = None
    press = _PRESS.match(incoming.text or "")
    if bot.manager_chat is not None and incoming.chat_id == bot.manager_chat and press:
        text = await _run(service, funnel, press.group(1), press.group(2), incoming)
    body: dict[str, Any] = {"callback_query_id": incoming.callback_id}
    if text:
        body["text"] = text[:200]
    await api.call(bot.token, "answerCallbackQuery", body)


async def _run(service: Service, funnel: str, action: str, session: str,
               incoming: Incoming) -> str:
    try:
        who = manager.manager_name(incoming.sender_name or "")
    except InvalidInput:
        who = f"telegram:{incoming.user_id}"
    try:
        engine = await service.engine(funnel)
        if action == "takeover":
            await manager.take_over(engine, session, who)
            return f"{who} took over {session}: the bot is silent there."
        if action == "approve":
            done = await manager.approve(engine, session, who)
            return f"{who} approved {session}: it is in {done['stage']} now."
        if action == "reject":
            await manager.reject(engine, session, who)
            return f"{who} rejected the move of {session}: it stays in its stage."
        await manager.release(engine, session, who)
        return f"{session} is back with the bot."
    except FunnelError as exc:  # no such session, not taken over, the database away
        return str(exc)
    except RequestRefused as exc:  # the service cannot run it now (503)
        return exc.message
    except Exception:  # a refusal of the service (503) or a bug: the button says so
        log.exception("the managers' button %s on %s/%s failed", action, funnel, session)
        return "That did not work; try again in a moment."
