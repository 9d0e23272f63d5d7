"""The words claims are made of, in uk, ru, en and pl: currencies, product words,
discount words, negations and the built-in promises.

Every pattern here runs on a *normalized* sentence (NFKC, case folded, ё as е,
apostrophes as ``'``, runs of spaces as one): see :func:`engine.claims.text.fold`.
The patterns are the engine's own, fixed, and written without nested unbounded
repetition: Python's ``re`` runs them (its ``\\b`` knows Cyrillic letters; RE2's does
not) in time linear in the sentence. A funnel's own patterns (``claims.custom``) run
by RE2.
"""

from __future__ import annotations

__all__ = ["CURRENCIES", "DISCOUNT_WORDS", "NEGATIONS", "PERCENT_WORDS", "PRICE_WORDS",
           "PRODUCT_WORDS", "PROMISES", "QUANTITY_UNITS"]

# ISO code -> the signs and words a reply writes it with (folded; a trailing ``*`` is a
# stem: any word that starts with it). A money amount is a number next to one of them.
CURRENCIES: dict[str, tuple[str, ...]] = {
    "UAH": ("₴", "uah", "грн", "гривн*", "гривен*", "гривень", "гривні", "гривня", "гривну",
            "hrn", "hryvn*", "hrywn*", "hrywien"),
    "USD": ("$", "usd", "dollar*", "долар*", "доллар*", "dolar*"),
    "EUR": ("€", "eur", "euro*", "євро", "евро"),
    "PLN": ("zł", "zl", "pln", "złot*", "zlot*", "злот*"),
    "RUB": ("₽", "rub", "руб*", "rubl*"),
    "GBP": ("£", "gbp", "pound*", "фунт*"),
}

# Words after which a bare number is a price ("it costs 99", "ціна 99").
PRICE_WORDS = ("cost", "costs", "price", "priced", "коштує", "коштують", "ціна", "ціною",
               "вартість", "стоит", "стоят", "цена", "ценой", "стоимость", "kosztuje",
               "kosztują", "cena", "koszt", "ceną")

# A number with one of these after it is a quantity, not money.
QUANTITY_UNITS = ("ml", "мл", "l", "л", "g", "г", "гр", "kg", "кг", "mg", "мг", "cm", "см",
                  "mm", "мм", "pcs", "шт", "szt", "x", "%")

# Words that make a percentage or say there is a discount.
PERCENT_WORDS = ("%", "percent*", "per cent", "відсот*", "процент*", "procent*")
DISCOUNT_WORDS = ("discount*", "sale", "sales", "off", "promo*", "coupon*", "знижк*",
                  "акці*", "розпродаж*", "промокод*", "скидк*", "акци*", "распродаж*",
                  "rabat*", "promocj*", "zniżk*", "wyprzedaż*", "kod rabatowy", "kupon*")

# A negation in front of a promise makes it none ("delivery is not free yet"); "no" and
# its kin count only right before the phrase (engine.claims.check).
NEGATIONS = ("not", "isn't", "aren't", "won't", "don't", "doesn't", "never", "haven't",
             "hasn't", "wasn't", "не", "ні", "ни", "nie")

# Product words, folded, as stems (a word starting with one names that kind of
# product, in any case ending): the canonical kind -> stems. "Exotic Spa шампунь" and
# "szampon Exotic Spa" name the catalog's "Exotic Spa shampoo".
PRODUCT_WORDS: dict[str, tuple[str, ...]] = {
    "shampoo": ("shampoo", "шампун", "szampon"),
    "serum": ("serum", "сироват", "сыворот"),
    "lotion": ("lotion", "лосьйон", "лосьон", "balsam"),
    "mask": ("mask", "маск"),
    "spray": ("spray", "спре", "sprej"),
    "conditioner": ("conditioner", "кондиціонер", "кондиционер", "odżywk"),
    "foam": ("foam", "піна", "піну", "піною", "піни", "пена", "пену", "пеной", "пены",
             "piank"),
    "kit": ("kit", "набір", "набор", "набору", "набора", "набором", "zestaw"),
    "balm": ("balm", "бальзам", "balsam"),
    "oil": ("oil", "олія", "олію", "олії", "масло", "масла", "olej"),
    "cream": ("cream", "крем", "krem"),
    "gel": ("gel", "гель", "żel"),
    "powder": ("powder", "пудр", "puder", "pudr"),
    "drops": ("drops", "крапл", "капл", "kropl"),
}

# The built-in promises: per language, the phrases that make one (Python ``re``, on a
# folded sentence). A sentence that asks (ends with "?") promises nothing.
_W = r"(?:\s+\S+){0,3}"  # up to three words between the parts of a phrase
PROMISES: dict[str, dict[str, str]] = {
    "free_delivery": {
        "en": rf"\bfree\s+(?:delivery|shipping)\b|\b(?:delivery|shipping){_W}\s+(?:is|are|will"
              rf"\s+be|comes)\s+(?:\S+\s+)?free\b|\bdeliver\S*{_W}\s+for\s+free\b",
        "uk": rf"безкоштовн\S*\s+доставк|безплатн\S*\s+доставк|доставк\S*{_W}\s+"
              r"(?:безкоштовн|безплатн)|доставим\S*{_W}\s+безкоштовно",
        "ru": rf"бесплатн\S*\s+доставк|доставк\S*{_W}\s+бесплатн|доставим\S*{_W}\s+бесплатно",
        "pl": rf"(?:darmow|bezpłatn)\S*\s+(?:dostaw|wysyłk)|(?:dostaw|wysyłk)\S*{_W}\s+"
              r"(?:darmow|bezpłatn|gratis)",
    },
    "gift": {
        "en": r"\bgifts?\b|\bfreebies?\b|\bbonus\s+product",
        "uk": r"подарун\S*|подарок",
        "ru": r"подар(?:ок|ка|ку|ком|ки)\b",
        "pl": r"prezent\S*|upomin\S*|gratisow\S*|w\s+gratisie",
    },
    "order_confirmed": {
        "en": rf"\b(?:order|request|purchase)\S*{_W}\s+(?:is\s+|has\s+been\s+|was\s+|been\s+|"
              r"are\s+|have\s+been\s+)?(?:confirmed|placed|approved|accepted|processed|"
              r"completed)\b|\bconfirming\s+(?:your\s+|the\s+)?order\b|\b(?:i|we)(?:'ve|\s+have)"
              r"\s+(?:confirmed|placed|accepted)\s+(?:your|the)\s+order",
        "uk": rf"(?:замовлен|заявк)\S*{_W}\s+(?:оформлен|підтвердж|прийнят|схвален)\S*|"
              r"(?:оформи|підтверди|прийня|схвали)(?:в|ла|ли|ло)\S*(?:\s+\S+){0,2}\s+"
              r"(?:замовлен|заявк)|підтверджую\s+(?:ваше\s+|це\s+)?замовлен",
        "ru": rf"(?:заказ|заявк)\S*{_W}\s+(?:оформлен|подтвержд|принят|одобрен)\S*|"
              r"(?:оформи|подтверди|приня|одобри)(?:л|ла|ли|ло)\S*(?:\s+\S+){0,2}\s+"
              r"(?:заказ|заявк)|подтверждаю\s+(?:ваш\s+|этот\s+)?заказ",
        "pl": rf"zamówieni\S*{_W}\s+(?:zostało\s+|jest\s+)?(?:potwierdzon|złożon|przyjęt|"
              r"zatwierdzon)\S*|(?:potwierdzi|złoży|przyję|zatwierdzi)\S*(?:\s+\S+){0,2}\s+"
              r"zamówieni|potwierdzam\s+(?:pana\s+|pani\s+|twoje\s+)?zamówieni",
    },
    "manager_contact": {
        "en": rf"\b(?:manager|consultant|colleague|specialist|operator|representative|"
              rf"someone|team)\S*{_W}\s+(?:will|'ll|is\s+going\s+to|shall)\s+(?:\S+\s+)?"
              r"(?:call|contact|phone|ring|reach|get\s+in\s+touch|write|message|text)",
        "uk": rf"(?:менеджер|консультант|оператор|фахів|спеціаліст)\S*{_W}\s+"
              r"(?:зателефонує|подзвонить|передзвонить|зв'яжеться|напише|наб[еи]ре)",
        "ru": rf"(?:менеджер|консультант|оператор|специалист)\S*{_W}\s+"
              r"(?:позвонит|перезвонит|свяжется|напишет|наберет)",
        "pl": rf"(?:menedżer|menadżer|menedzer|konsultant|doradc|specjalist)\S*{_W}\s+"
              r"(?:zadzwoni|oddzwoni|skontaktuje|napisze|odezwie)",
    },
}
