"""What the language steps cost a realistic turn, in callgrind instructions: the part of
the turn above the floor that no engine change can remove (issue 32).

    python bench/language_instructions.py

Runs ``engine.turn.language``'s two steps of every turn (``decide`` on the customer's
message, ``reply_problem`` on the model's reply) over bench/realistic_turn.py's
conversation (its messages and the scripted replies, Puramur's policy), at two numbers
of repetitions under ``valgrind --tool=callgrind``, and prints the instructions per turn
(the difference over the extra turns: start-up and the models' loading cancel out), next
to the same for a Ukrainian conversation (Cyrillic: the marker rules decide most).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
_COLLECTED = re.compile(r"Collected\s*:\s*(\d+)")
UK = [("Привіт! Мені потрібна порада для моєї кішки.",
       "Вітаю! Я консультант Puramur. У вас кішка чи собака?"),
      ("Кішка, сфінкс. У неї дуже суха шкіра.",
       "Шкіра сфінкса потребує делікатного догляду. Скільки їй років?"),
      ("Їй три роки. Що порадите?", "Раджу шампунь Exotic Spa і зволожувальний лосьйон."),
      ("А скільки коштує?", "Шампунь коштує 450 гривень, лосьйон 380.")]


def child(conversation: str, repeats: int) -> None:
    from realistic_turn import HAPPY, message

    from engine import load_funnel
    from engine.turn import language

    policy = load_funnel(ROOT / "funnels" / "puramur.yaml").spec.language_policy
    language.warm(policy.candidates)
    if conversation == "en":
        pairs = [(message(t), HAPPY[min(t, len(HAPPY) - 1)]["reply"]) for t in range(10)]
    else:
        pairs = UK
    current = "uk"
    for _ in range(repeats):
        for text, reply in pairs:
            decision = language.decide(policy, text, current)
            language.reply_problem(policy, decision, reply)
            current = decision.response
    print(len(pairs))


def count(conversation: str, repeats: int) -> tuple[int, int]:
    with open(os.devnull, "w") as null:
        out = subprocess.run(
            ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
             sys.executable, __file__, "--child", conversation, str(repeats)],
            capture_output=True, text=True, check=True, env={**os.environ, "PYTHONHASHSEED": "0"},
            stdin=null)
    found = _COLLECTED.search(out.stderr)
    assert found, out.stderr[-2000:]
    return int(found.group(1)), int(out.stdout.split()[-1])


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child(sys.argv[2], int(sys.argv[3]))
        return
    if shutil.which("valgrind") is None:
        raise SystemExit("needs valgrind (Debian's package)")
    print("| conversation | instructions per turn (decide + reply_problem) |\n|---|---|")
    for conversation in ("en", "uk"):
        small, pairs = count(conversation, 2)
        large, _ = count(conversation, 12)
        print(f"| {conversation} (bench/realistic_turn.py's) |" if conversation == "en" else
              f"| {conversation} |", f"{(large - small) // (10 * pairs):,} |")


if __name__ == "__main__":
    main()
