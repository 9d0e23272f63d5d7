"""Phone numbers of ``format: phone`` fields, with libphonenumber's rules (``phonenumbers``).

A field declares its default region, an ISO 3166 code (``region: UA``): a national
number (``066 123 45 67``, ``8 (912) 345-67-89`` in Russia, ``0151 2345 6789`` in
Germany) is read as that region's, with its own trunk prefix; an international one
(``+49 ...`` or ``00 49 ...``) as itself. What is not a valid number of its region
is refused; what is, is stored in E.164 (``+4915123456789``).

The older ``country_code: "380"`` (a calling code) still works: it stands for the
region that owns the code (``380``: ``UA``; ``1``: ``US``; ``7``: ``RU``), and
``funnel validate`` warns that it is deprecated (F009).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import phonenumbers

__all__ = ["MAX_PHONE_CHARS", "example", "known_region", "normalize_phone",
           "region_for_calling_code", "region_of"]

# Longer than any number written with spaces, dashes and an extension: no parse past it.
MAX_PHONE_CHARS = 64


def known_region(region: str) -> bool:
    """Whether ``region`` is an ISO 3166 code libphonenumber has numbers for."""
    return region in phonenumbers.SUPPORTED_REGIONS


def region_for_calling_code(code: str) -> str | None:
    """The main region of a calling code (``"380"`` -> ``"UA"``), or None if there is none."""
    if not code.isdigit():
        return None
    region = phonenumbers.region_code_for_country_code(int(code))
    return None if region == phonenumbers.UNKNOWN_REGION else str(region)


def region_of(schema: Mapping[str, Any]) -> str | None:
    """The field's default region: ``region``, else the one its ``country_code`` stands for."""
    region = schema.get("region")
    if isinstance(region, str):
        return region.upper()
    code = schema.get("country_code")
    return region_for_calling_code(str(code)) if code is not None else None


def normalize_phone(raw: str, region: str | None) -> str | None:
    """``raw`` in E.164 (``"066 123-45-67"``, ``"UA"`` -> ``"+380661234567"``), or None when
    it is not a valid number (national numbers need ``region``)."""
    text = raw.strip()
    if not text or len(text) > MAX_PHONE_CHARS:
        return None
    if text.startswith("00"):
        # The international prefix of most of the world, whatever the field's region
        # dials (the US dials 011): no national number starts with 00.
        text = "+" + text[2:]
    try:
        number = phonenumbers.parse(text, region)
    except phonenumbers.NumberParseException:
        return None
    if not phonenumbers.is_valid_number(number):
        return None
    return str(phonenumbers.format_number(number, phonenumbers.PhoneNumberFormat.E164))


def example(region: str | None) -> str:
    """A number of ``region`` as its customers write it, for a notice (``066 123 4567``)."""
    number = phonenumbers.example_number_for_type(
        region, phonenumbers.PhoneNumberType.MOBILE) if region else None
    if number is None:
        return "+380 66 123 4567"
    return str(phonenumbers.format_number(number, phonenumbers.PhoneNumberFormat.NATIONAL))
