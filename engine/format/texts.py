"""Texts the engine sends a customer instead of the model, in the customer's language.

A funnel writes such a text (a stage's ``fallback``, ``memory.too_long_reply``,
``handoff.holding_reply``, an approval's ``holding_reply``) as a plain string, meaning
the funnel's default language, or as a map by language::

    fallback: {uk: "Розкажіть трохи більше…", en: "Tell me a little more…"}

:class:`Localized` holds either form; :meth:`Localized.pick` chooses the text for the
session's response language at the point the text is sent, else the funnel's default
language. A language the text lacks is a ``funnel validate`` warning (F704), never a
silent switch (docs/language.md#engine-texts).

The engine's own texts (the defaults of those settings, the technical error reply)
ship in Ukrainian, Russian, English and Polish: :data:`FALLBACK`, :data:`TOO_LONG`,
:data:`TECHNICAL`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["BUILTIN_LANGUAGES", "FALLBACK", "NAMES", "TECHNICAL", "TOO_LONG", "Localized",
           "name_of"]

# Languages by ISO 639-1 code, for messages (the repair prompt, `funnel validate`).
NAMES = {
    "uk": "Ukrainian", "ru": "Russian", "en": "English", "pl": "Polish", "de": "German",
    "fr": "French", "es": "Spanish", "it": "Italian", "pt": "Portuguese", "ro": "Romanian",
    "cs": "Czech", "sk": "Slovak", "be": "Belarusian", "kk": "Kazakh", "tr": "Turkish",
}


def name_of(code: str) -> str:
    """``"uk"`` -> ``"Ukrainian"``; unknown codes come back as they are."""
    return NAMES.get(code, code)


@dataclass(frozen=True)
class Localized:
    """A customer text by language: a plain string (the funnel's default language) or a
    map ``{language: text}``.

    Attributes:
        texts: (language, text) pairs, in the order written; the first is the last
            resort when neither the asked language nor the default is there.
        plain: the text of a plain string: the funnel's default language's, whatever
            that is (so it is known without the funnel's language policy).
    """

    texts: tuple[tuple[str, str], ...] = ()
    plain: str | None = None
    # The same pairs as a dict: picking is on every turn's path, a lookup or two.
    _by: dict[str, str] = field(default_factory=dict, init=False, repr=False, compare=False,
                                hash=False)

    def __post_init__(self) -> None:
        if not self.texts and self.plain is None:
            raise ValueError("a customer text needs a string or at least one language")
        object.__setattr__(self, "_by", dict(self.texts))

    @classmethod
    def of(cls, raw: Any) -> Localized:
        """A (schema-valid) text of a funnel file: a string, or a map by language."""
        if isinstance(raw, Localized):
            return raw
        if isinstance(raw, Mapping):
            return cls(tuple((str(k), str(v)) for k, v in raw.items()))
        return cls(plain=str(raw))

    @classmethod
    def optional(cls, raw: Any) -> Localized | None:
        """:meth:`of`, or None for a text the funnel does not give."""
        return None if raw is None else cls.of(raw)

    @property
    def languages(self) -> tuple[str, ...]:
        """The languages the map gives (none for a plain string)."""
        return tuple(self._by)

    def pick(self, language: str | None, default: str | None) -> str:
        """The text in ``language`` (the session's response language), else in
        ``default`` (the funnel's default language; a plain string is that one), else the
        first the map gives: `funnel validate` warns of every language missing (F704).
        """
        if language is not None:
            text = self._by.get(language)
            if text is not None:
                return text
        if self.plain is not None:
            return self.plain
        if default is not None:
            text = self._by.get(default)
            if text is not None:
                return text
        return self.texts[0][1]


# The languages of the engine's own texts: a funnel that declares another one and leaves
# a text to the engine is warned (F704).
BUILTIN_LANGUAGES: tuple[str, ...] = ("en", "uk", "ru", "pl")

# English first: the last resort for a language none of the funnel's is (a model-policy
# funnel whose model reports German).
FALLBACK = Localized((
    ("en", "Sorry, I did not quite get that. Could you say it again?"),
    ("uk", "Вибачте, мені не зовсім зрозуміло. Чи можете сказати це ще раз?"),
    ("ru", "Извините, мне не совсем понятно. Можете сказать это ещё раз?"),
    ("pl", "Przepraszam, nie do końca rozumiem. Czy możesz to powtórzyć?"),
))

TOO_LONG = Localized((
    ("en", "Your message is too long for me to take in at once. Could you shorten it, or "
           "send it in a few parts?"),
    ("uk", "Ваше повідомлення задовге, щоб прочитати його за один раз. Чи можете скоротити "
           "його або надіслати кількома частинами?"),
    ("ru", "Ваше сообщение слишком длинное, чтобы прочитать его за один раз. Можете "
           "сократить его или отправить несколькими частями?"),
    ("pl", "Twoja wiadomość jest za długa, by przeczytać ją za jednym razem. Czy możesz ją "
           "skrócić albo wysłać w kilku częściach?"),
))

# The reply when not even the stage's fallback is at hand (the stage is unknown).
TECHNICAL = Localized((
    ("en", "Sorry, something went wrong on our side. Please send your message again."),
    ("uk", "Вибачте, у нас щось пішло не так. Будь ласка, надішліть повідомлення ще раз."),
    ("ru", "Извините, у нас что-то пошло не так. Пожалуйста, отправьте сообщение ещё раз."),
    ("pl", "Przepraszamy, coś poszło u nas nie tak. Wyślij, proszę, wiadomość jeszcze raz."),
))
