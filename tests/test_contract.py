"""Each stage's output contract derived from the funnel (engine.format.contract).

The shipped funnels moved from hand-written schema folders to derived contracts: the
schemas they replaced are kept in tests/data/replaced_schemas, and every derived
contract must accept no output that its replaced schema refused (equal or stricter),
over the scenarios' model outputs and the hostile corpus, each tried on every stage.
Then `funnel validate` on a derived contract's mistakes, extensions and overrides, and
`funnel schema`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import B2B, PURAMUR, ROOT, CliResult, puramur_data, run_funnel
from hostile_corpus import MODEL_OUTPUTS
from jsonschema import Draft202012Validator

from engine.boundary.sanitize import Rejected, model_json
from engine.funnel.compiled import load_funnel
from engine.validation import check_file
from engine.validation.schemas import action_types

REPLACED = Path(__file__).parent / "data" / "replaced_schemas"
FUNNELS = {"puramur": PURAMUR, "b2b_demo": B2B}
# b2b_demo's two closing stages shared one file.
REPLACED_FILE = {"disqualified": "closing.json", "booked": "closing.json"}


def _outputs() -> list[dict[str, Any]]:
    """Model outputs to try: every scenario's and the hostile corpus's JSON objects."""
    found: list[dict[str, Any]] = []
    for folder in ("puramur", "b2b_demo"):
        for path in (ROOT / "funnels" / folder / "scenarios").rglob("*.yaml"):
            for turn in yaml.safe_load(path.read_text("utf-8")).get("turns") or []:
                llm = turn.get("llm")
                if isinstance(llm, dict) and "reply" in llm:
                    found.append(json.loads(json.dumps(llm, default=str)))
    for _, content, _ in MODEL_OUTPUTS:
        try:  # what reaches the contract: the output past the sanitizing boundary
            value = model_json(content)
        except Rejected:
            continue
        if isinstance(value, dict):
            found.append(value)
    # Variations: each output without its actions, without its updates, and with the
    # actions of every other output (actions a stage may not take).
    actions = [a for o in found for a in (o.get("actions") or []) if isinstance(a, dict)]
    extra = [{k: v for k, v in o.items() if k != "actions"} for o in found]
    extra += [{**o, "actions": [a]} for o in found[:40] for a in actions]
    extra += [{"reply": "ok", "actions": []}, {"reply": "ok", "updates": {}},
              {"reply": "x" * 1501}, {"reply": ""}, {"reply": "ok", "language": "english"}]
    return found + extra


OUTPUTS = _outputs()
STAGES = [(f, s) for f, path in FUNNELS.items() for s in load_funnel(path).stages]


@pytest.mark.parametrize(("funnel", "stage"), STAGES, ids=[f"{f}-{s}" for f, s in STAGES])
def test_every_derived_contract_is_equal_to_or_stricter_than_the_schema_it_replaced(
        funnel: str, stage: str) -> None:
    compiled = load_funnel(FUNNELS[funnel]).stages[stage]
    assert compiled.spec.derived and compiled.spec.schema is None
    replaced = json.loads((REPLACED / funnel / REPLACED_FILE.get(stage, f"{stage}.json"))
                          .read_text("utf-8"))
    old = Draft202012Validator(replaced)
    accepted = 0
    for output in OUTPUTS:
        if compiled.validator.is_valid(output):
            accepted += 1
            assert old.is_valid(output), (stage, output)
        # The fast validator gives the same verdict as the authority.
        assert compiled.fast_validator is not None
        assert compiled.fast_validator.is_valid(output) == compiled.validator.is_valid(output)
    assert accepted >= 3
    # The same fields and actions as before, no more.
    old_updates = set(replaced["properties"].get("updates", {}).get("properties", {}))
    assert compiled.allowed_updates <= old_updates
    assert compiled.allowed_actions == {t for _, t in action_types(replaced)}
    assert list(compiled.schema["properties"])[0] == "reply"  # streaming reads it first


def test_one_enum_changed_in_state_changes_every_stage_that_writes_the_field(
        tmp_path: Path) -> None:
    text = PURAMUR.read_text("utf-8").replace("enum: [cat, dog]", "enum: [cat, dog, ferret]")
    funnel = load_funnel(_write(tmp_path, text))
    for name in ("greeting", "discovery", "presentation", "objection_handling"):
        pet = funnel.stages[name].schema["properties"]["updates"]["properties"]["pet"]
        assert pet["properties"]["type"]["enum"] == ["cat", "dog", "ferret"]
    # A dotted path narrows an object: greeting may write the customer's name only.
    customer = funnel.stages["greeting"].schema["properties"]["updates"]["properties"][
        "customer"]
    assert set(customer["properties"]) == {"name"} and customer["additionalProperties"] is False
    # A small catalog's SKUs are present_products' enum.
    skus = funnel.stages["presentation"].schema["$defs"]["present_products"]["properties"][
        "skus"]["items"]["enum"]
    assert "PR251010" in skus and len(skus) == len(funnel.catalog.products)  # type: ignore[union-attr]


def _write(tmp_path: Path, text: str, name: str = "funnel.yaml") -> Path:
    """Puramur's text at ``tmp_path/name``, reading the repository's files (FUNNEL_ROOT)."""
    text = text.replace("prompts: ../prompts/puramur", f"prompts: {ROOT / 'prompts/puramur'}")
    text = text.replace("catalog: puramur/catalog.yaml",
                        f"catalog: {ROOT / 'funnels/puramur/catalog.yaml'}")
    text = text.replace("folder: puramur/knowledge",
                        f"folder: {ROOT / 'funnels/puramur/knowledge'}")
    path = tmp_path / name
    path.write_text(text, "utf-8")
    return path


def _problems(path: Path) -> list[tuple[str, int, str, str]]:
    _, diagnostics = check_file(path)
    return [(Path(d.file).name, d.line, d.code, d.message) for d in diagnostics
            if d.severity == "error"]


def _line(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


@pytest.mark.parametrize(("old", "new", "code", "hint"), [
    ("updates: [pet, customer.name]\n", "updates: [pet, customer.nmae]\n", "F307",
     "did you mean 'name'?"),
    ("updates: [pet, customer.name]\n", "updates: [pett, customer.name]\n", "F307",
     "did you mean 'pet'?"),
    ("    actions: [add_to_cart, remove_from_cart, request_handoff]\n",
     "    actions: [add_to_kart, remove_from_cart, request_handoff]\n", "F305",
     "did you mean 'add_to_cart'?"),
    ("    updates: [customer]\n    actions: [add_to_cart",
     "    updates: [customer, cart_total]\n    actions: [add_to_cart", "F304", "engine owns"),
    ("      detail: {type: string, maxLength: 200}\n", "      detail: pet.bred\n", "F307",
     "did you mean 'breed'?"),
    ("  actions: [request_handoff]     # the", "  actions: [request_hadnoff]     # the",
     "F305", "did you mean 'request_handoff'?"),
])
def test_validate_explains_a_derived_contracts_mistake_at_the_funnels_line(
        tmp_path: Path, old: str, new: str, code: str, hint: str) -> None:
    text = PURAMUR.read_text("utf-8")
    assert old in text
    text = text.replace(old, new, 1)
    problems = _problems(_write(tmp_path, text))
    assert [(f, c) for f, _, c, _ in problems] == [("funnel.yaml", code)], problems
    _, line, _, message = problems[0]
    assert line == _line(text, new.strip().splitlines()[0]) and hint in message


def test_a_field_whose_schema_is_invalid_is_said_once_at_its_own_line(tmp_path: Path) -> None:
    """Four stages derive their contracts from `pet`: one error, at the bad keyword."""
    old = "      breed: {type: string, maxLength: 60}"
    text = PURAMUR.read_text("utf-8")
    assert old in text
    text = text.replace(old, "      breed: {type: string, maxLength: -60}", 1)
    problems = _problems(_write(tmp_path, text))
    assert [(f, c) for f, _, c, _ in problems] == [("funnel.yaml", "F301")], problems
    _, line, _, message = problems[0]
    assert line == _line(text, "      breed: {type: string, maxLength: -60}")
    assert message.startswith("state field 'pet' is not a valid JSON Schema: at "
                              "`properties/breed/maxLength`: -60 is less than the minimum of 0")


def test_an_extension_is_merged_and_checked_like_a_schema(tmp_path: Path) -> None:
    text = PURAMUR.read_text("utf-8").replace(
        "    updates: [pet, customer.name]\n",
        "    updates: [pet, customer.name]\n    schema_extension: greeting_extra.json\n", 1)
    path = _write(tmp_path, text)
    assert [c for _, _, c, _ in _problems(path)] == ["F301"]  # the file does not exist yet
    (tmp_path / "schemas").mkdir()
    extra = tmp_path / "schemas" / "greeting_extra.json"
    extra.write_text(json.dumps({"properties": {"reply": {"maxLength": 300}}}))
    assert _problems(path) == []
    greeting = load_funnel(path).stages["greeting"]
    assert greeting.schema["properties"]["reply"]["maxLength"] == 300
    assert greeting.schema["properties"]["updates"]["properties"]["pet"]  # still derived
    assert greeting.spec.schema == extra
    # An extension that lets the model write an engine-owned field is an error, in its file.
    extra.write_text('{\n  "properties": {"updates": {"properties": {\n'
                     '    "cart_total": {"type": "number"}}}}}\n')
    problems = _problems(path)
    assert [(f, ln, c) for f, ln, c, _ in problems] == [("greeting_extra.json", 3, "F304")]


def test_a_hand_written_schema_may_not_allow_more_than_the_stage_declares(
        tmp_path: Path) -> None:
    (tmp_path / "schemas").mkdir()
    contract = load_funnel(PURAMUR).stages["contact_collection"].schema
    (tmp_path / "schemas" / "handoff.json").write_text(json.dumps(contract))
    text = PURAMUR.read_text("utf-8").replace(
        "    updates: [customer]\n    actions: []",
        "    schema: handoff.json\n    updates: [customer]\n    actions: []", 1)
    problems = _problems(_write(tmp_path, text))
    assert {c for _, _, c, _ in problems} == {"F308"}
    assert any("'add_to_cart'" in m for *_, m in problems)


def test_a_funnel_with_a_schema_folder_keeps_working(tmp_path: Path) -> None:
    """No `output:`, no `updates:`/`actions:`: each stage reads `<stage>.json` as before."""
    data = puramur_data()
    data.pop("output")
    for stage in data["stages"].values():
        stage.pop("updates", None)
        stage.pop("actions", None)
    data["schemas"] = str(REPLACED / "puramur")
    text = yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
    path = _write(tmp_path, text)
    assert _problems(path) == []
    funnel = load_funnel(path)
    assert not any(s.spec.derived for s in funnel.stages.values())
    assert funnel.stages["handoff"].schema["properties"]["actions"]["maxItems"] == 0
    # Without its files, the error says how to derive the contract instead.
    path.write_text(text.replace(str(REPLACED / "puramur"), str(tmp_path / "none")))
    problems = _problems(path)
    assert {c for _, _, c, _ in problems} == {"F301"} and "`updates:`" in problems[0][3]


def cli(*args: str, cwd: Path = ROOT) -> CliResult:
    return run_funnel(*args, cwd=cwd)  # in process: about the output, not the process


def test_funnel_schema_prints_and_writes_the_contracts(tmp_path: Path) -> None:
    one = cli("schema", "funnels/puramur.yaml", "--stage", "handoff")
    assert one.returncode == 0, one.stderr
    assert json.loads(one.stdout) == load_funnel(PURAMUR).stages["handoff"].schema
    every = json.loads(cli("schema", "funnels/b2b_demo.yaml").stdout)
    assert list(every) == list(load_funnel(B2B).stages)
    typo = cli("schema", "funnels/puramur.yaml", "--stage", "handof")
    assert typo.returncode == 1 and "did you mean 'handoff'?" in typo.stderr
    path = _write(tmp_path, PURAMUR.read_text("utf-8"))
    written = cli("schema", str(path), "--write", cwd=tmp_path)
    assert written.returncode == 0, written.stderr
    files = sorted(p.name for p in (tmp_path / "schemas").glob("*.json"))
    assert files == sorted(f"{s}.json" for s in load_funnel(path).stages)
    assert _problems(path) == []  # written for review: the funnel stays the source


def test_a_closed_pipe_ends_a_command_quietly() -> None:
    """`funnel ... | head`: no BrokenPipeError traceback, whatever the command prints."""
    for args in (["schema", "funnels/puramur.yaml"], ["validate", "funnels/", "--format", "json"],
                 ["graph", "funnels/puramur.yaml"]):
        with subprocess.Popen([sys.executable, "-m", "engine.cli", *args], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
            assert proc.stdout is not None and proc.stderr is not None
            proc.stdout.close()
            err = proc.stderr.read().decode()
            proc.wait(timeout=120)
        assert "Traceback" not in err and "BrokenPipe" not in err, err
