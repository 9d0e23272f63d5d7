"""The webhook, acknowledged fast; the turn in the background; the reply via the outbox.

An update with a customer message is answered 200 as soon as the message and its
delivery key (the bot and ``update_id``) are committed, in one statement. The
turn then runs in the background of the worker that took it, and saves its
reply as an outbox row (kind ``reply``) in the turn's own transaction. The
dispatcher delivers it with ``sendMessage``: a 429 waits its ``retry_after``, a
5xx or a network error backs off, a 403 marks the session unreachable and stops.
A session's replies go out in order. With streaming on for the bot, the reply is shown
while the model writes it, in one message edited at most once a second, and its
delivery is that message's last edit (engine.service.telegram.live). A re-delivered update finds its key taken
and is acknowledged without a second turn or a second reply, on any worker. An
update acknowledged by a worker that died before answering is claimed, once its
claim ran out, by the sweep of another worker: the message log is the queue.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ...errors import DuplicateDelivery, StoreUnavailable
from ...format.texts import Localized
from ...store import Inbound, OutboxItem
from ...turn.notify import Outcome, Targets, dispatch
from ..config import TelegramBot
from ..limits import MAX_UPDATE_BYTES, RequestRefused, error, read_json
from . import managers
from .botapi import MAX_TEXT, BotApi, backoff
from .live import LiveReply
from .updates import Incoming, parse

if TYPE_CHECKING:
    from ..core import Service

log = logging.getLogger("funnel.service.telegram")

CHANNEL = "telegram"
# Notes instead of a turn, in the session's language (else the funnel's default one).
POLITE = {
    "sticker": Localized((
        ("en", "Nice sticker! I can only read text, though: tell me in words how I can help."),
        ("uk", "Гарний стікер! Але я читаю лише текст: напишіть словами, чим можу допомогти."),
        ("ru", "Хороший стикер! Но я читаю только текст: напишите словами, чем могу помочь."),
        ("pl", "Fajna naklejka! Czytam jednak tylko tekst: napisz, proszę, w czym mogę pomóc."),
    )),
    "photo": Localized((
        ("en", "Thank you for the photo! I can't see pictures yet; please describe it in a "
               "message."),
        ("uk", "Дякую за фото! Я поки не бачу зображень; будь ласка, опишіть його в "
               "повідомленні."),
        ("ru", "Спасибо за фото! Я пока не вижу изображений; пожалуйста, опишите его в "
               "сообщении."),
        ("pl", "Dziękuję za zdjęcie! Nie widzę jeszcze obrazów; opisz je, proszę, w "
               "wiadomości."),
    )),
    "media": Localized((
        ("en", "I can only read text messages; please write to me what you need."),
        ("uk", "Я читаю лише текстові повідомлення; будь ласка, напишіть, що вам потрібно."),
        ("ru", "Я читаю только текстовые сообщения; пожалуйста, напишите, что вам нужно."),
        ("pl", "Czytam tylko wiadomości tekstowe; napisz, proszę, czego potrzebujesz."),
    )),
    "edited": Localized((
        ("en", "I see you edited a message. I only read new ones, so please send the "
               "correction as a new message."),
        ("uk", "Бачу, ви відредагували повідомлення. Я читаю лише нові, тож надішліть, будь "
               "ласка, виправлення новим повідомленням."),
        ("ru", "Вижу, вы отредактировали сообщение. Я читаю только новые, поэтому отправьте, "
               "пожалуйста, исправление новым сообщением."),
        ("pl", "Widzę, że wiadomość została zmieniona. Czytam tylko nowe, więc wyślij, "
               "proszę, poprawkę jako nową wiadomość."),
    )),
}
TURN_KINDS = ("text", "caption", "contact", "start")
_MESSAGE_KEYS = ("message", "edited_message", "callback_query", "my_chat_member")


def bot_id(bot: TelegramBot) -> int | None:
    """The bot's user id: the token's part before the colon."""
    head = bot.token.partition(":")[0]
    return int(head) if head.isdigit() else None


class TelegramChannel:
    """Webhook handling and Bot API delivery for every funnel that has a bot."""

    def __init__(self, service: Service, api: str) -> None:
        self.service = service
        self.api = BotApi(api)
        self._tasks: set[asyncio.Task[Any]] = set()
        # session -> (lock, turns holding or awaiting it): its turns run in arrival order
        self._order: dict[str, tuple[asyncio.Lock, list[int]]] = {}
        self._usernames: dict[str, str] = {}
        # Live replies (engine.service.telegram.live): the message each turn's reply was
        # streamed into, by the message's delivery key, until the reply is delivered;
        # and when each chat last got a call of theirs.
        self._live: dict[str, tuple[int, str]] = {}
        self._last_call: dict[Any, float] = {}
        # Hand-off alerts also go to a funnel's managers' chat, when it has one.
        for name, notifier in service.notifiers.items():
            bot = service.config.telegram_bot(name)
            if bot is not None and bot.manager_chat is not None and isinstance(
                    notifier, Targets):
                notifier.targets["telegram"] = managers.alert(self.api, bot)

    async def start(self) -> None:
        await self.api.start()

    def queued(self) -> int:
        """Accepted messages of this worker waiting behind an earlier one of their session."""
        return sum(max(0, users[0] - 1) for _, users in self._order.values())

    async def close(self) -> None:
        while self._tasks:  # turns accepted here finish before the process stops
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        await self.api.close()

    # -- the webhook -------------------------------------------------------------------
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
            if 400 <= exc.status < 500:
                # A body no parse can use (a lone surrogate, NaN, too deep or too big):
                # Telegram would send it again and again on a 4xx. Counted, acknowledged.
                log.warning("telegram update for %s refused: %s", funnel, exc.message)
                self.service.metrics.count("funnel_telegram_updates_total", funnel=funnel,
                                           kind="unusable")
                return JSONResponse({"ok": True})
            return exc.response()
        if not isinstance(update, dict) or type(update.get("update_id")) is not int or any(
                k in update and not isinstance(update[k], dict) for k in _MESSAGE_KEYS):
            return error(400, "bad_request", "not a Telegram update: an object with an integer "
                         "`update_id` and, if any, an object `message` / `edited_message` / "
                         "`callback_query` / `my_chat_member`")
        username = bot.username or self._usernames.get(funnel)
        if bot.groups and username is None:
            username = await self._username(funnel, bot)
        incoming = parse(update, bot_id=bot_id(bot), username=username, groups=bot.groups)
        self.service.metrics.count("funnel_telegram_updates_total", funnel=funnel,
                                   kind=incoming.kind)
        key = f"{bot_id(bot) or 0}:{update['update_id']}"
        if incoming.kind == "callback":
            if incoming.callback_id:  # a managers' button runs; any other stops spinning
                self._background(managers.pressed(self.service, self.api, funnel, bot,
                                                  incoming))
            return JSONResponse({"ok": True})
        if incoming.kind in POLITE:
            return await self._note(funnel, incoming, key, POLITE[incoming.kind])
        if incoming.kind not in TURN_KINDS or incoming.text is None:
            return JSONResponse({"ok": True})
        return await self._accept(funnel, bot, incoming, key)

    async def _accept(self, funnel: str, bot: TelegramBot, incoming: Incoming, key: str
                      ) -> Response:
        """Commit the message with its key, answer Telegram, run the turn after."""
        service = self.service
        try:
            engine = await service.engine(funnel)
            meta = {"reply_to": incoming.reply_to()}
            facts = self._facts(funnel, bot, incoming)
            if facts:
                meta["facts"] = facts
            message_id = await engine.store.accept_message(
                engine.spec, incoming.session_id, incoming.text or "", Inbound(CHANNEL, key),
                service.holder, meta)
        except RequestRefused as exc:
            return exc.response()  # a 503: Telegram sends the update again
        except StoreUnavailable:
            return service.trip().response()
        if message_id is None:
            service.metrics.count("funnel_replays_total", funnel=funnel, channel=CHANNEL)
            return JSONResponse({"ok": True, "duplicate": True})
        self._background(self._answer(funnel, incoming.session_id, incoming.text or "", key,
                                      message_id, meta))
        return JSONResponse({"ok": True})

    def _facts(self, funnel: str, bot: TelegramBot, incoming: Incoming) -> dict[str, str]:
        """The deep link's payload, kept in the funnel's attribution field if it has one."""
        if incoming.start_payload is None:
            return {}
        field = self.service.funnels[funnel].spec.state.get(bot.start_field or "")
        if field is None or field.type != "string":
            self.service.metrics.count("funnel_telegram_start_payloads_dropped_total",
                                       funnel=funnel)
            return {}
        return {field.name: incoming.start_payload}

    async def _note(self, funnel: str, incoming: Incoming, key: str, note: Localized
                    ) -> Response:
        """A polite note instead of a turn, through the outbox (once per update), in the
        session's response language (its row's ``language.response``), else the funnel's
        default language."""
        if incoming.chat_id is None:
            return JSONResponse({"ok": True})
        try:
            engine = await self.service.engine(funnel)
            spec = engine.spec
            # A read for a rare kind of update, off the turns' path.
            row = await engine.store.load(spec, incoming.session_id) \
                if spec.language_response else None
            language = (row or {}).get(spec.language_response or "")
            text = note.pick(language if isinstance(language, str) else None,
                             spec.language_policy.default)
            added = await engine.store.add_outbox(funnel, incoming.session_id, [OutboxItem(
                key=f"{funnel}:{CHANNEL}:{key}:note", kind="reply",
                payload={**incoming.reply_to(), "text": text})])
        except RequestRefused as exc:
            return exc.response()
        except StoreUnavailable:
            return self.service.trip().response()
        if added:
            self._background(self.deliver_due(funnel, incoming.session_id))
        return JSONResponse({"ok": True, **({} if added else {"duplicate": True})})

    # -- the turn, in the background ---------------------------------------------------
    async def _answer(self, funnel: str, session_id: str, text: str, key: str,
                      message_id: int, meta: Mapping[str, Any]) -> None:
        """Run an accepted message's turn (its reply is an outbox row), then deliver."""
        lock, users = self._order.setdefault(session_id, (asyncio.Lock(), [0]))
        users[0] += 1
        try:
            async with lock:
                target = meta.get("reply_to") or {}
                self._typing(funnel, target)
                bot = self.service.config.telegram_bot(funnel)
                live = LiveReply(self.api, bot.token, target, self._last_call) if (
                    bot is not None and bot.stream and target.get("chat_id") is not None
                ) else None
                try:
                    await self.service.converse(
                        funnel, session_id, text, channel=CHANNEL, key=key,
                        reply_to={**target, "key": key}, message_id=message_id,
                        facts=meta.get("facts"),
                        stream=live.listener if live is not None else None)
                finally:
                    shown = await live.close() if live is not None else None
                    if shown is not None:
                        self._live[key] = shown
        except DuplicateDelivery:
            pass  # answered already (another worker's sweep got there first)
        except RequestRefused as exc:
            # Left pending: once its claim runs out, a sweep answers it.
            log.warning("telegram turn of %s/%s not run yet: %s", funnel, session_id,
                        exc.message)
            return
        except Exception:
            log.exception("telegram turn of %s/%s failed", funnel, session_id)
            return
        finally:
            users[0] -= 1
            if not users[0]:
                self._order.pop(session_id, None)
        await self.deliver_due(funnel, session_id)

    def _typing(self, funnel: str, target: Mapping[str, Any]) -> None:
        """"typing..." in the chat while the turn runs (Telegram shows it for 5 s, or until
        the bot's next message); its failure changes nothing, so it is not retried."""
        bot = self.service.config.telegram_bot(funnel)
        if bot is None or target.get("chat_id") is None:
            return
        body: dict[str, Any] = {"chat_id": target["chat_id"], "action": "typing"}
        if type(target.get("message_thread_id")) is int:
            body["message_thread_id"] = target["message_thread_id"]
        self._background(self.api.call(bot.token, "sendChatAction", body))

    def _background(self, job: Any) -> None:
        task = asyncio.get_running_loop().create_task(job)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def sweep(self, funnel: str) -> int:
        """Claim messages accepted and left unanswered (a dead worker's) and answer them."""
        if self.service.config.telegram_bot(funnel) is None:
            return 0
        engine = self.service.engines.get(funnel)
        if engine is None:
            return 0
        claimed = await engine.store.claim_inbound(funnel, CHANNEL, self.service.holder)
        for key, pending in claimed:
            if pending.message_id is None or pending.text is None:
                continue
            meta = pending.meta or {}
            self.service.metrics.count("funnel_inbound_recovered_total", funnel=funnel,
                                       channel=CHANNEL)
            self._background(self._answer(funnel, pending.session_id, pending.text, key,
                                          pending.message_id, meta))
        return len(claimed)

    # -- delivery ----------------------------------------------------------------------
    async def deliver_due(self, funnel: str, session_id: str | None = None) -> int:
        """Deliver the due outbox rows of ``funnel`` (of one session), replies included."""
        engine = self.service.engines.get(funnel)
        if engine is None:
            return 0
        try:
            return await dispatch(engine.store, {funnel: engine.notifier}, funnel=funnel,
                                  session_id=session_id, senders=self.senders(funnel))
        except StoreUnavailable as exc:
            log.warning("outbox of %s: %s", funnel, exc)
            return 0

    def senders(self, funnel: str) -> dict[str, Any]:
        if self.service.config.telegram_bot(funnel) is None:
            return {}
        return {"reply": self.send_reply}

    async def send_reply(self, row: Mapping[str, Any]) -> Outcome:
        """Deliver one ``reply`` outbox row with ``sendMessage``; never raises."""
        funnel, session_id = str(row["funnel"]), str(row["session_id"])
        payload = row["payload"] if isinstance(row["payload"], dict) else {}
        bot = self.service.config.telegram_bot(funnel)
        if bot is None:
            return Outcome("no Telegram bot is configured for this funnel", give_up=True)
        text = str(payload.get("text") or "")[:MAX_TEXT]
        key = payload.get("key") if isinstance(payload.get("key"), str) else None
        if not text.strip():
            return Outcome()  # nothing to say: nothing to send
        store = self.service.engines[funnel].store
        if key is not None and key in self._live:
            done = await self._finish_live(bot.token, store, funnel, session_id, key, text,
                                           payload, row)
            if done is not None:
                return done
        body: dict[str, Any] = {"chat_id": payload.get("chat_id"), "text": text}
        if type(payload.get("message_thread_id")) is int:
            body["message_thread_id"] = payload["message_thread_id"]
        if type(payload.get("reply_to_message_id")) is int:
            body["reply_parameters"] = {"message_id": payload["reply_to_message_id"],
                                        "allow_sending_without_reply": True}
        result = await self.api.call(bot.token, "sendMessage", body)
        metrics = self.service.metrics
        if result.ok:
            metrics.count("funnel_telegram_replies_delivered_total", funnel=funnel)
            await self._record(store, funnel, session_id, key, "delivered")
            return Outcome()
        metrics.count("funnel_telegram_send_errors_total", funnel=funnel)
        log.warning("telegram sendMessage for funnel %s failed: %s", funnel, result.problem)
        if result.final:
            await self._record(store, funnel, session_id, key, f"failed: {result.problem}",
                               result.unreachable)
            if result.unreachable:
                metrics.count("funnel_telegram_unreachable_total", funnel=funnel)
            return Outcome(result.problem, give_up=True)
        attempts = int(row.get("attempts") or 1)
        return Outcome(result.problem, retry_in=result.retry_in or backoff(attempts))

    async def _finish_live(self, token: str, store: Any, funnel: str, session_id: str,
                           key: str, text: str, payload: Mapping[str, Any],
                           row: Mapping[str, Any]) -> Outcome | None:
        """Deliver a reply that was streamed into a live message: the message's last edit
        (none when it shows the reply already). None: it cannot be edited, send it."""
        message_id, shown = self._live[key]
        if shown != text:
            result = await self.api.call(token, "editMessageText", {
                "chat_id": payload.get("chat_id"), "message_id": message_id, "text": text})
            if not result.ok and "not modified" not in result.problem:
                if not result.final:  # 429, 5xx: the outbox tries the edit again
                    attempts = int(row.get("attempts") or 1)
                    return Outcome(result.problem,
                                   retry_in=result.retry_in or backoff(attempts))
                del self._live[key]  # gone, too old to edit: a message of its own
                return None
        del self._live[key]
        self.service.metrics.count("funnel_telegram_replies_delivered_total", funnel=funnel)
        await self._record(store, funnel, session_id, key, "delivered")
        return Outcome()

    async def _record(self, store: Any, funnel: str, session_id: str, key: str | None,
                      delivery: str, unreachable: str | None = None) -> None:
        try:
            await store.record_delivery(funnel, CHANNEL, session_id, key, delivery,
                                        unreachable)
        except StoreUnavailable as exc:
            log.warning("could not record the delivery of a reply of %s: %s", funnel, exc)

    async def _username(self, funnel: str, bot: TelegramBot) -> str | None:
        """The bot's @username (``getMe``), to tell mentions of it in groups."""
        result = await self.api.call(bot.token, "getMe", {})
        name = result.result.get("username") if result.ok and isinstance(
            result.result, dict) else None
        if isinstance(name, str) and name:
            self._usernames[funnel] = name
            return name
        return None
