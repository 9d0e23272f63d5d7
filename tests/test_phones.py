"""``format: phone``: real numbers of many countries, national and international, each
stored exactly in E.164 or refused with a notice (engine.format.phones, through the
state's normalisation as a turn applies it), and the deprecated ``country_code``."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.format.phones import normalize_phone, region_of
from engine.funnel.state import normalize_formats
from engine.validation import validate_paths

ROOT = Path(__file__).resolve().parent.parent

# (region, as the customer wrote it, what is stored: E.164, or None for a refusal)
NUMBERS = [
    # Ukraine: trunk 0, the calling code written without +, 00 and +
    ("UA", "066 123 45 67", "+380661234567"),
    ("UA", "(050) 123-45-67", "+380501234567"),
    ("UA", "380661234567", "+380661234567"),
    ("UA", "+380 66 123 4567", "+380661234567"),
    ("UA", "00380661234567", "+380661234567"),
    ("UA", "066 123 45", None),                # too short
    ("UA", "066 123 45 678", None),            # too long
    # Germany: trunk 0 and a code that does not end in 0 (the old code's bug)
    ("DE", "0151 2345 6789", "+4915123456789"),
    ("DE", "030 901820", "+4930901820"),
    ("DE", "+49 (0)151 23456789", "+4915123456789"),
    ("DE", "0049 151 23456789", "+4915123456789"),
    ("DE", "0151 2", None),
    # United Kingdom
    ("GB", "07911 123456", "+447911123456"),
    ("GB", "020 7946 0018", "+442079460018"),
    ("GB", "+44 7911 123456", "+447911123456"),
    ("GB", "07911 12345", None),
    # France
    ("FR", "06 12 34 56 78", "+33612345678"),
    ("FR", "01 42 68 53 00", "+33142685300"),
    ("FR", "+33 6 12 34 56 78", "+33612345678"),
    ("FR", "06 12 34 56", None),
    # Russia: trunk 8
    ("RU", "8 (912) 345-67-89", "+79123456789"),
    ("RU", "8 800 555 35 35", "+78005553535"),
    ("RU", "+7 912 345 67 89", "+79123456789"),
    ("RU", "8 (912) 345-67", None),
    # United States: no trunk 0; a 1 in front; 555-01xx is the fictional range
    ("US", "(201) 555-0123", "+12015550123"),
    ("US", "1 201 555 0123", "+12015550123"),
    ("US", "+1 650-253-0000", "+16502530000"),
    ("US", "(099) 555-0123", None),            # no area code starts with 0
    # Poland: no trunk prefix
    ("PL", "512 345 678", "+48512345678"),
    ("PL", "+48 22 123 45 67", "+48221234567"),
    ("PL", "512 345 67", None),
    # Italy: the leading 0 of a landline is part of the number
    ("IT", "06 6982 0000", "+390669820000"),
    ("IT", "312 345 6789", "+393123456789"),
    ("IT", "+39 06 69820000", "+390669820000"),
    # Spain
    ("ES", "612 34 56 78", "+34612345678"),
    ("ES", "91 123 45 67", "+34911234567"),
    ("ES", "0034 612 345 678", "+34612345678"),
    ("ES", "612 34 56", None),
    # Japan: trunk 0
    ("JP", "090-1234-5678", "+819012345678"),
    ("JP", "03-1234-5678", "+81312345678"),
    ("JP", "+81 90 1234 5678", "+819012345678"),
    # India: trunk 0 on mobiles
    ("IN", "098765 43210", "+919876543210"),
    ("IN", "98765 43210", "+919876543210"),
    ("IN", "+91 98765 43210", "+919876543210"),
    ("IN", "98765 4321", None),
    # Brazil
    ("BR", "(11) 91234-5678", "+5511912345678"),
    ("BR", "+55 11 91234 5678", "+5511912345678"),
    # Kazakhstan shares +7 with Russia
    ("KZ", "8 701 123 4567", "+77011234567"),
    # A number of another country in a Ukrainian field: international forms only
    ("UA", "+49 151 23456789", "+4915123456789"),
    ("UA", "0044 7911 123456", "+447911123456"),
    # Not numbers at all
    ("UA", "call me tomorrow", None),
    ("UA", "", None),
    ("UA", "0" * 80, None),
    # No region: only international numbers
    (None, "+380 66 123 4567", "+380661234567"),
    (None, "066 123 45 67", None),
]


@pytest.mark.parametrize(("region", "raw", "stored"), NUMBERS)
def test_each_number_is_stored_in_e164_or_refused(region: str | None, raw: str,
                                                 stored: str | None) -> None:
    schema = {"type": "string", "format": "phone", **({"region": region} if region else {})}
    notices: list[str] = []
    assert normalize_formats(raw, schema, "customer.phone", notices) == stored
    if stored is None:
        assert len(notices) == 1 and "not a valid phone number for customer.phone" in notices[0]
        assert "not saved" in notices[0]
        if region:
            assert f"a number of {region}" in notices[0]
    else:
        assert notices == []


def test_ten_countries_at_least() -> None:
    assert len({r for r, _, _ in NUMBERS if r}) >= 10


@pytest.mark.parametrize(("code", "region"), [("380", "UA"), ("49", "DE"), ("44", "GB"),
                                             ("7", "RU"), ("1", "US")])
def test_the_old_country_code_still_works_as_its_region(code: str, region: str) -> None:
    assert region_of({"format": "phone", "country_code": code}) == region
    national = {"UA": "066 123 45 67", "DE": "0151 2345 6789", "GB": "07911 123456",
                "RU": "8 (912) 345-67-89", "US": "(201) 555-0123"}[region]
    assert normalize_phone(national, region_of({"country_code": code})) == \
        normalize_phone(national, region)
    # The region wins over a calling code that disagrees with it.
    assert region_of({"region": "DE", "country_code": "380"}) == "DE"


def test_validate_warns_of_country_code_and_refuses_an_unknown_region(tmp_path: Path) -> None:
    text = (ROOT / "funnels" / "puramur.yaml").read_text("utf-8")
    assert "region: UA" in text and "country_code" not in text  # the shipped funnel moved
    for region, code, expect in [('country_code: "380"', "F009", "write region: UA"),
                                 ("region: XY", "F008", "not an ISO 3166 code"),
                                 ('country_code: "999"', "F008", "no country's calling code")]:
        funnel = tmp_path / "puramur.yaml"
        funnel.write_text(text.replace("region: UA", region).replace(
            "../prompts", str(ROOT / "prompts")).replace("../schemas", str(ROOT / "schemas"))
            .replace("puramur/", str(ROOT / "funnels" / "puramur") + "/"), "utf-8")
        found = [d for d in validate_paths([funnel]) if d.code in ("F008", "F009")]
        assert len(found) == 1 and expect in found[0].message, found
        assert found[0].severity == ("warning" if code == "F009" else "error")
        assert found[0].code == code
