"""`funnel validate` against a corpus of broken funnels, and the CLI around it.

Each folder of ``tests/corpus/`` is one case: a funnel (a copy of ``_base``
with a mistake) plus the prompts, schemas and catalog it needs, and
``expected.txt`` listing the diagnostics it must produce as ``CODE FILE:LINE``
(FILE relative to the case folder). ``_base`` itself expects nothing.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from pathlib import Path

import pytest
from conftest import CliResult, run_funnel

from engine.validation import Diagnostic, validate_paths

ROOT = Path(__file__).resolve().parent.parent
CORPUS = Path(__file__).resolve().parent / "corpus"
CASES = sorted(p.parent for p in CORPUS.glob("*/expected.txt"))
LINE = re.compile(r"^(F\d{3}) (\S+):(\d+)$")

# The codes the corpus must exercise (docs/funnel-format.md lists them all).
REQUIRED_CODES = {
    "F001", "F002", "F003", "F004", "F005", "F007", "F008", "F009",
    "F101", "F102", "F103", "F104", "F105", "F110",
    "F201", "F202", "F203", "F205", "F206",
    "F301", "F302", "F303", "F304", "F305", "F306", "F310", "F311",
    "F401", "F402", "F403", "F404", "F405", "F406", "F407", "F408",
    "F501", "F502", "F504", "F505", "F507", "F508", "F509", "F601", "F602", "F603", "F604",
    "F704", "F705",
}  # fmt: skip

Key = tuple[str, str, int]


def expected(case: Path) -> list[Key]:
    out = []
    for n, raw in enumerate((case / "expected.txt").read_text("utf-8").splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = LINE.match(line)
        assert m, f"{case.name}/expected.txt:{n}: not `CODE FILE:LINE`: {raw!r}"
        out.append((m[1], m[2], int(m[3])))
    return sorted(out)


def key(d: Diagnostic, case: Path) -> Key:
    return (d.code, Path(os.path.relpath(d.file, case)).as_posix(), d.line)


def diagnostics(case: Path) -> list[Diagnostic]:
    return validate_paths([case])


def run_cli(*args: str) -> CliResult:
    return run_funnel(*args)


# --- the corpus ----------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_corpus_case(case: Path) -> None:
    got = diagnostics(case)
    assert sorted(key(d, case) for d in got) == expected(case), "\n".join(
        d.format() for d in got
    )


def test_corpus_covers_every_required_code() -> None:
    codes = {code for case in CASES for code, _, _ in expected(case)}
    assert REQUIRED_CODES <= codes, f"no corpus case for {sorted(REQUIRED_CODES - codes)}"
    assert (CORPUS / "_base") in CASES and expected(CORPUS / "_base") == []
    assert len(CASES) >= 30


def test_every_code_is_documented() -> None:
    doc = (ROOT / "docs" / "funnel-format.md").read_text("utf-8")
    documented = set(re.findall(r"^\| (F\d{3}) \|", doc, re.MULTILINE))
    produced = {d.code for d in validate_paths([CORPUS])}
    assert REQUIRED_CODES | produced <= documented, sorted(REQUIRED_CODES | produced - documented)


def test_every_diagnostic_names_a_real_line() -> None:
    for case in CASES:
        for d in diagnostics(case):
            assert d.line >= 1 and d.col >= 1, d.format()
            lines = Path(d.file).read_text("utf-8").splitlines()
            assert d.line <= len(lines), d.format()
            assert d.message.strip() and "\n" not in d.message, d.format()


def _one(case: str, code: str) -> Diagnostic:
    found = [d for d in diagnostics(CORPUS / case) if d.code == code]
    assert len(found) == 1, found
    return found[0]


def test_unknown_key_suggests_the_right_one() -> None:
    d = _one("f003_unknown_key", "F003")
    assert "did you mean" in d.message
    assert "'description'" in d.message and "'descripton'" in d.message


def test_unknown_condition_field_suggests_the_right_one() -> None:
    assert "did you mean 'score'" in _one("f402_condition_unknown_field", "F402").message
    assert "did you mean 'name'" in _one("multiple_errors", "F402").message


def test_template_names_suggest_the_right_one() -> None:
    assert "did you mean 'score'" in _one("f203_unknown_variable", "F203").message
    assert "did you mean 'phone'" in _one("f203_unknown_property", "F203").message
    assert "did you mean 'stage'" in _one("f601_index_unknown_column", "F601").message
    assert "did you mean 'handoff_at'" in _one("f110_feature_field", "F110").message
    assert "did you mean 'GIFT02'" in _one("f502_gift_not_in_catalog", "F502").message


def test_on_enter_types_suggest_a_declared_action() -> None:
    found = {d.line: d.message for d in diagnostics(CORPUS / "f504_on_enter_unknown_action")}
    assert "'notte'" in found[42] and "did you mean 'note'?" in found[42]
    # A builtin's name is not an action's: point at the action that uses it.
    assert "did you mean 'note', the action that uses it?" in found[48]
    assert "'request_handoff' is a builtin" in found[50]
    assert "`request_handoff: {builtin: request_handoff}`" in found[50]


def test_hook_without_its_function() -> None:
    found = {d.line: d.message for d in diagnostics(CORPUS / "f505_hook_missing_function")}
    assert "has no function 'push_lead' (did you mean 'push_leads'?)" in found[36]
    assert "the handoff notifier" in found[32] and "'alert_manager'" in found[32]


def test_shared_table_and_index_names_name_the_other_file() -> None:
    table = _one("f602_shared_table", "F602")
    assert table.file.endswith("other.yaml")
    assert "f602_shared_table/funnel.yaml:4" in table.message
    found = {(Path(d.file).name, d.line): d.message
             for d in diagnostics(CORPUS / "f603_shared_index")}
    assert "line 23 of this funnel" in found[("funnel.yaml", 24)]
    assert "f603_shared_index/funnel.yaml:22" in found[("other.yaml", 21)]
    assert "is also the table of" in found[("other.yaml", 22)]


def test_shared_funnel_name_names_the_other_file() -> None:
    d = _one("f604_shared_funnel_name", "F604")
    assert (Path(d.file).name, d.line, d.col) == ("other.yaml", 2, 9)
    assert "funnel name 'corpus_f604_shared_funnel_name'" in d.message
    assert "f604_shared_funnel_name/funnel.yaml:2" in d.message
    assert "mix their conversations" in d.message and "own `funnel:` name" in d.message
    # Every corpus case has a funnel name of its own: only this case's other.yaml collides.
    assert [x.file for x in validate_paths([CORPUS]) if x.code == "F604"] == [d.file]


def test_severities() -> None:
    warnings = {"F009", "F106", "F311", "F403", "F404", "F408", "F508", "F509", "F704"}
    for case in CASES:
        for d in diagnostics(case):
            assert d.severity == ("warning" if d.code in warnings else "error"), d.format()


def test_messages_say_what_is_wrong() -> None:
    assert "threshold" in _one("f403_unreachable_threshold", "F403").message
    assert "100" in _one("f403_unreachable_threshold", "F403").message  # the reachable maximum
    assert "trailing comma" in _one("f301_invalid_json", "F301").message
    assert "endfor" in _one("f202_template_syntax", "F202").message
    assert "products.yaml" in _one("f502_missing_catalog", "F502").message
    overflow = _one("f509_cart_total_overflow", "F509").message
    assert "numeric(10,2)" in overflow and "99,999,999.99" in overflow
    assert "100,000,524.50" in overflow and "`column: numeric(12,2)`" in overflow
    assert "`column: bigint`" in _one("f509_cart_total_integer", "F509").message
    owned = [d for d in diagnostics(CORPUS / "f304_engine_owned") if d.code == "F304"]
    assert {m for d in owned for m in ("'stage'", "'score'") if m in d.message} == {
        "'stage'",
        "'score'",
    }


# --- reference funnels and whole runs ---------------------------------------------------------


def test_reference_funnels_are_clean() -> None:
    files = sorted((ROOT / "funnels").glob("*.yaml"))
    assert {f.name for f in files} >= {"puramur.yaml", "b2b_demo.yaml"}
    for f in files:
        assert validate_paths([f]) == [], f
    assert validate_paths([ROOT / "funnels"]) == []
    # One funnel reached twice (through its folder, and by an absolute path) shares nothing.
    puramur = (ROOT / "funnels" / "puramur.yaml").resolve()
    assert validate_paths([ROOT / "funnels", puramur, "funnels/puramur.yaml"]) == []


def test_one_run_reports_several_independent_errors() -> None:
    case = CORPUS / "multiple_errors"
    got = diagnostics(case)
    assert len({d.code for d in got}) >= 6
    assert len({d.file for d in got}) == 3  # the funnel, a template and a schema
    # The whole corpus in one call: every case's diagnostics, none lost, none added.
    everything = validate_paths([CORPUS])
    want = Counter(
        (code, (case / file).resolve().as_posix(), line)
        for case in CASES
        for code, file, line in expected(case)
    )
    have = Counter((d.code, Path(d.file).resolve().as_posix(), d.line) for d in everything)
    assert have == want


# --- the CLI -------------------------------------------------------------------------------


def test_cli_clean_exit_0() -> None:
    r = run_cli("validate", "funnels/")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout == ""
    assert "0 error(s), 0 warning(s)" in r.stderr


def test_cli_errors_exit_1() -> None:
    r = run_cli("validate", "tests/corpus/multiple_errors")
    assert r.returncode == 1
    lines = r.stdout.splitlines()
    assert len(lines) == 6
    assert all(re.match(r"^tests/corpus/multiple_errors/\S+:\d+:\d+: error F\d{3} ", x)
               for x in lines), lines
    assert "6 error(s), 0 warning(s)" in r.stderr


@pytest.mark.parametrize(("case", "code", "position"), [
    ("f602_shared_table", "F602", "4:8"),  # the table
    ("f604_shared_funnel_name", "F604", "2:9"),  # the funnel's name
])
def test_cli_shared_name_is_reported_on_the_later_file(case: str, code: str,
                                                       position: str) -> None:
    folder = f"tests/corpus/{case}"
    r = run_cli("validate", f"{folder}/other.yaml", f"{folder}/funnel.yaml")
    assert r.returncode == 1
    assert r.stdout.startswith(f"{folder}/funnel.yaml:{position}: error {code} "), r.stdout
    assert f"{folder}/other.yaml:{position.split(':')[0]}" in r.stdout
    assert "1 error(s), 0 warning(s)" in r.stderr
    # One file reached twice (by its folder and by name) does not collide with itself.
    assert run_cli("validate", folder, f"{folder}/funnel.yaml", f"./{folder}/funnel.yaml"
                   ).stdout.count(code) == 1
    for name in ("funnel.yaml", "other.yaml"):
        assert run_cli("validate", f"{folder}/{name}").returncode == 0  # alone, it is fine


def test_cli_warnings_exit_0_unless_strict() -> None:
    case = "tests/corpus/f403_unreachable_threshold"
    r = run_cli("validate", case)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "warning F403" in r.stdout
    strict = run_cli("validate", "--strict", case)
    assert strict.returncode == 1
    assert strict.stdout == r.stdout


@pytest.mark.parametrize(
    "args",
    [
        ["validate"],
        ["validate", "--format", "xml", "funnels/"],
        ["validate", "--bogus", "funnels/"],
        [],
        ["nonsense"],
    ],
    ids=["no-path", "bad-format", "bad-flag", "no-command", "bad-command"],
)
def test_cli_usage_error_exit_2(args: list[str]) -> None:
    r = run_cli(*args)
    assert r.returncode == 2
    assert "usage:" in r.stderr
    assert "Traceback" not in r.stderr


def test_cli_json_format() -> None:
    r = run_cli("validate", "--format", "json", "tests/corpus/multiple_errors")
    assert r.returncode == 1
    data = json.loads(r.stdout)
    assert isinstance(data, list) and len(data) == 6
    for item in data:
        assert set(item) == {"file", "line", "col", "severity", "code", "message"}
        assert isinstance(item["line"], int) and item["line"] >= 1
    clean = run_cli("validate", "--format", "json", "funnels/")
    assert clean.returncode == 0
    assert json.loads(clean.stdout or "[]") == []


def test_cli_github_format() -> None:
    r = run_cli("validate", "--format", "github", "tests/corpus/multiple_errors",
                "tests/corpus/f403_unreachable_threshold")
    assert r.returncode == 1
    lines = r.stdout.splitlines()
    assert len(lines) == 7
    pattern = re.compile(r"^::(error|warning) file=([^,]+),line=(\d+),col=\d+,title=(F\d{3})::\S")
    parsed = [pattern.match(x) for x in lines]
    assert all(parsed), lines
    assert sum(1 for m in parsed if m and m[1] == "error") == 6
    assert any(
        m and m[1] == "warning" and m[4] == "F403" and m[3] == "45" for m in parsed
    ), lines
    assert any(
        x.startswith("::error file=tests/corpus/multiple_errors/funnel.yaml,line=4,") for x in lines
    ), lines


def test_cli_never_prints_a_traceback() -> None:
    r = run_cli("validate", "tests/corpus")
    assert r.returncode == 1
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout
    for args in (
        ["validate", "tests/corpus/f001_yaml_syntax/funnel.yaml"],
        ["validate", "tests/corpus/no_such_case"],
        ["graph", "tests/corpus/f001_yaml_syntax/funnel.yaml"],
        ["graph", "tests/corpus/multiple_errors/funnel.yaml"],
        ["sql", "tests/corpus/f101_unknown_stage/funnel.yaml"],
        ["sql", "tests/corpus/no_such_file.yaml"],
    ):
        r = run_cli(*args)
        assert r.returncode == 1, (args, r.stdout, r.stderr)
        assert "Traceback" not in r.stderr, (args, r.stderr)
        assert re.search(r"(F\d{3}|error)", r.stdout + r.stderr), (args, r.stdout, r.stderr)


# --- validate and the engine agree on actions and hooks ---------------------------------------


def test_builtins_are_the_runners() -> None:
    from engine.funnel.actions import ActionRunner
    from engine.validation.actions import builtin_names

    runner = {m.removeprefix("_do_") for m in dir(ActionRunner) if m.startswith("_do_")}
    assert set(builtin_names()) == runner


def test_hook_functions_are_read_without_running_the_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from engine.validation.actions import hook_function_defined

    (tmp_path / "beside.py").write_text(
        "import os\nfrom json import dumps as dump\ntry:\n    import fast\nexcept ImportError:\n"
        "    def fast(call): ...\nasync def hook(call): ...\nraise SystemExit('never run')\n")
    (tmp_path / "star.py").write_text("from os.path import *\n")
    (tmp_path / "lazy.py").write_text("def __getattr__(name): ...\n")
    (tmp_path / "broken.py").write_text("def hook(call):\nreturn 1\n")
    for fn in ("hook", "fast", "dump"):
        assert hook_function_defined("beside", fn, tmp_path) == (True, ""), fn
    assert hook_function_defined("beside", "os", tmp_path)[0] is False  # a module: not callable
    defined, why = hook_function_defined("beside", "hok", tmp_path)
    assert defined is False and "did you mean 'hook'?" in why
    assert hook_function_defined("star", "anything", tmp_path) == (None, "")
    assert hook_function_defined("lazy", "anything", tmp_path) == (None, "")
    defined, why = hook_function_defined("broken", "hook", tmp_path)
    assert defined is False and "does not parse" in why
    # On the Python path and not imported yet: its source is read; imported: it is asked.
    elsewhere = tmp_path / "path"
    elsewhere.mkdir()
    (elsewhere / "corpus_path_hooks.py").write_text("def push(call): ...\n")
    monkeypatch.syspath_prepend(str(elsewhere))
    assert hook_function_defined("corpus_path_hooks", "push", ROOT)[0] is True
    assert hook_function_defined("corpus_path_hooks", "pull", ROOT)[0] is False
    assert hook_function_defined("engine.funnel.actions", "load_hook", ROOT)[0] is True
    assert hook_function_defined("engine.funnel.actions", "unload_hook", ROOT)[0] is False
    assert hook_function_defined("sys", "anything", ROOT)[0] is False  # built in, imported


def test_a_funnel_validate_refuses_is_one_the_engine_refuses() -> None:
    from engine.errors import FunnelInvalid
    from engine.funnel.compiled import load_funnel

    for case, code in (("f504_on_enter_unknown_action", "F504"),
                       ("f505_hook_missing_function", "F505")):
        with pytest.raises(FunnelInvalid) as caught:
            load_funnel(CORPUS / case / "funnel.yaml")
        assert {d.code for d in caught.value.diagnostics} == {code}
    # A funnel alone may not reuse its own index names either.
    with pytest.raises(FunnelInvalid) as caught:
        load_funnel(CORPUS / "f603_shared_index" / "funnel.yaml")
    assert [d.line for d in caught.value.diagnostics] == [24]


def test_a_hook_module_that_fails_to_load_fails_again_on_the_next_load(tmp_path: Path) -> None:
    from engine.errors import ConfigError
    from engine.funnel.actions import load_hook

    (tmp_path / "flaky_hooks.py").write_text(
        "def push(state, args):\n    return None\n\nraise ImportError('the CRM client is missing')\n",
        "utf-8")
    for _ in range(2):  # not a half-run module from the first try, without the error
        with pytest.raises(ConfigError, match="the CRM client is missing"):
            load_hook("flaky_hooks:push", tmp_path)
