"""Hostile funnel files: bounded work in conditions and templates, files confined to the funnel.

The bombs run in a child process with a 1.5 GB address-space limit: without
the bounds they die of ``MemoryError`` (or the limit); with them they are
refused with a message. Nothing here measures time.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from jinja2.exceptions import SecurityError

from engine.errors import ConfigError
from engine.format.paths import OutsideFunnel, confine, funnel_roots
from engine.funnel.compiled import load_funnel
from engine.sandbox.expressions import compile_condition, make_environment
from engine.sandbox.templates import MAX_ITERATIONS, WorkLimit

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "corpus"

BOMBS = [
    "{{ ('a' * 10**10) | length }}",
    "{{ ('a' * 10**9) | length }}",
    "{{ [1, 2] * 10**8 }}",
    "{{ 10 ** (10 ** 10) }}",
    "{{ 7 ** 1000000 }}",
    "{{ '{:>999999999}'.format(1) }}",
    "{{ '%999999999d' % 1 }}",
    "{{ '%*d' % (999999999, 1) }}",
    "{{ '%.999999999f'|format(1.5) }}",
    "{{ 'a'|center(1000000000) }}",
    "{{ 'a'|indent(1000000000, true) }}",
    "{{ 'a'.ljust(10**9) }}",
    "{{ 'a'.zfill(10**9) }}",
    "{{ 'abc'|replace('', 'x' * 60000) }}",
    "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
    "{% endfor %}{{ ns.s|length }}",
    "{% set ns = namespace(s=[1]) %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}"
    "{% endfor %}{{ ns.s|length }}",
    "{% set ns = namespace(n=3) %}{% for i in range(64) %}{% set ns.n = ns.n * ns.n %}"
    "{% endfor %}{{ ns.n > 0 }}",
    "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}",
    "{{ range(100000) | join('x' * 99999) | length }}",
    "{{ (['x' * 99999] * 100000) | length }}",
    "{{ range(100000) | map('center', 999) | list | length }}",
    "{{ [1] | slice(1000000000) | list | length }}",
    "{{ [1] | batch(1000000000, 'x') | list | length }}",
    "{{ ''.join(['x' * 99999] * 10) }}",
    "{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}",
]


@pytest.fixture
def memory_cap() -> Iterator[None]:
    """At most 2 GB more address space while a bomb runs: a regression fails, not the machine."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    pages = int(Path("/proc/self/statm").read_text().split()[0])
    cap = pages * resource.getpagesize() + 2_000_000_000
    resource.setrlimit(resource.RLIMIT_AS, (cap if hard == resource.RLIM_INFINITY
                                            else min(cap, hard), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@pytest.mark.usefixtures("memory_cap")
@pytest.mark.parametrize("source", BOMBS)
def test_template_bombs_are_refused(source: str) -> None:
    with pytest.raises(WorkLimit):
        make_environment().from_string(source).render()


@pytest.mark.usefixtures("memory_cap")
def test_condition_bombs_are_refused() -> None:
    for source in ("('a' * 10**10) | length > 0", "(10 ** (10 ** 10)) > 0",
                   "('x' * 100000 ~ 'y') | length > 0"):
        with pytest.raises(WorkLimit):
            compile_condition(source)({})


def test_bombs_die_of_the_limit_without_the_bounds_and_not_with_them() -> None:
    # The same expression under a 1.5 GB limit: the bounded sandbox refuses it
    # with a message, jinja's plain sandbox runs out of memory.
    script = textwrap.dedent("""
        import resource, sys
        resource.setrlimit(resource.RLIMIT_AS, (1_500_000_000, 1_500_000_000))
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        from engine.sandbox.expressions import make_environment
        env = make_environment() if sys.argv[1] == "bounded" else ImmutableSandboxedEnvironment()
        try:
            env.from_string("{{ ('a' * 10**10) | length }}").render()
        except MemoryError:
            print("MemoryError")
        except Exception as exc:
            print(type(exc).__name__)
    """)
    out = {kind: subprocess.run([sys.executable, "-c", script, kind], capture_output=True,
                                text=True, cwd=ROOT, timeout=120).stdout.strip()
           for kind in ("bounded", "plain")}
    assert out == {"bounded": "WorkLimit", "plain": "MemoryError"}


def test_ordinary_templates_still_work() -> None:
    env = make_environment()
    out = env.from_string(
        "{{ '-' * 3 }}{{ 2 ** 10 }} {{ '%.2f' % 3.14159 }} {{ '%s-%s'|format('a', 'b') }} "
        "{{ 'x'|center(5) }}| {{ 'hi {}'.format('you') }} {{ [1] + [2] }} {{ 'a' ~ 'b' }}"
        "{% for i in range(3) %}{{ i }}{% endfor %} {{ 'a b'|replace(' ', '_') }}"
    ).render()
    assert out == "---1024 3.14 a-b   x  | hi you [1, 2] ab012 a_b"
    loop = env.from_string(
        "{% for i in 'abc' %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}"
        "{{ loop.revindex0 }}{{ loop.length }}{{ loop.first }}{{ loop.last }}{{ loop.depth }}"
        "{{ loop.previtem if not loop.first else '-' }}"
        "{{ loop.nextitem if not loop.last else '-' }}{{ loop.cycle('x', 'y') }}"
        "{% if not loop.last %}, {% endif %}{% endfor %}").render()
    assert loop == ("10323TrueFalse1-bx, 21213FalseFalse1acy, "
                    "32103FalseTrue1b-x")
    assert compile_condition("score >= 60 and pet.type")({"score": 70, "pet": {"type": "cat"}})


def test_loop_budget_is_per_render() -> None:
    template = make_environment().from_string(
        "{% for i in range(" + str(MAX_ITERATIONS // 2) + ") %}{% endfor %}ok")
    assert [template.render() for _ in range(3)] == ["ok"] * 3


def test_sandbox_still_refuses_internals() -> None:
    env = make_environment()
    for source in ("{{ ''.__class__ }}", "{{ x|attr('__class__') }}",
                   "{% for i in [1] %}{{ loop.__class__ }}{% endfor %}",
                   "{% for i in [1] %}{{ loop._iterator }}{% endfor %}",
                   "{{ '{0.__class__}'.format(x) }}", "{{ x.update({'a': 1}) }}"):
        with pytest.raises(SecurityError):
            env.from_string(source).render(x={})
    assert "lipsum" not in env.globals


# --- files outside the funnel --------------------------------------------------------------


def _funnel_copy(tmp_path: Path) -> Path:
    """The corpus's base funnel, copied with its prompts and schemas into ``tmp_path/f``."""
    folder = tmp_path / "f"
    shutil.copytree(CORPUS / "_base" / "prompts", folder / "prompts")
    shutil.copytree(CORPUS / "_base" / "schemas", folder / "schemas")
    text = (CORPUS / "_base" / "funnel.yaml").read_text("utf-8")
    text = text.replace("../_base/prompts", "prompts").replace("../_base/schemas", "schemas")
    (folder / "funnel.yaml").write_text(text, "utf-8")
    return folder / "funnel.yaml"


def test_paths_are_confined(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FUNNEL_ROOT", raising=False)
    path = _funnel_copy(tmp_path)
    roots = funnel_roots(path)
    assert roots == (path.parent.resolve(),)
    assert confine(path.parent / "prompts" / "greeting.j2", roots).name == "greeting.j2"
    (path.parent / ".env").write_text("FUNNEL_SECRET=x")
    for bad in (Path("/proc/self/environ"), Path("/etc/passwd"), path.parent / ".." / "x.j2",
                path.parent / ".env"):
        with pytest.raises(OutsideFunnel):
            confine(bad, roots)
    monkeypatch.setenv("FUNNEL_ROOT", str(tmp_path))
    assert tmp_path.resolve() in funnel_roots(path)


def test_a_template_swapped_for_a_symlink_after_validation_is_refused(tmp_path: Path) -> None:
    path = _funnel_copy(tmp_path)
    funnel = load_funnel(path)
    assert "Greet the customer" in funnel.stage("greeting").template.render(
        stage="greeting", customer={"name": None})
    greeting = path.parent / "prompts" / "greeting.j2"
    greeting.unlink()
    os.symlink("/etc/hostname", greeting)
    with pytest.raises(ConfigError, match="outside"):
        load_funnel(path)  # validate refuses it (F007)
    from engine.funnel.compiled import CompiledFunnel

    with pytest.raises(OutsideFunnel):
        CompiledFunnel(funnel.spec)  # and so does the loader, on its own


def test_an_include_through_a_symlink_is_refused_at_render(tmp_path: Path) -> None:
    folder = tmp_path / "prompts"
    folder.mkdir()
    os.symlink("/etc/hostname", folder / "secret.j2")
    (folder / "page.j2").write_text("{% include 'secret.j2' %}")
    env = make_environment(folder, (tmp_path,))
    with pytest.raises(OutsideFunnel):
        env.get_template("page.j2").render()


# --- validate, on the hostile corpus cases ----------------------------------------------------

HOSTILE = ["f001_alias_bomb_7", "f001_alias_bomb_9", "f001_deep_nesting", "f205_work_bombs",
           "f007_prompt_outside", "f007_folders_outside", "f007_symlink", "f007_include_outside",
           "f301_deep_json"]


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (1_500_000_000, 1_500_000_000))


@pytest.mark.parametrize("case", HOSTILE)
def test_validate_refuses_hostile_cases_with_a_located_error(case: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "engine.cli", "validate", f"tests/corpus/{case}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          preexec_fn=_limited)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "Error:" not in proc.stderr.split("\n")[0]
    first = proc.stdout.splitlines()[0]
    assert f"tests/corpus/{case}/" in first and ": error F" in first
    # Nothing of what lies outside leaked into the messages.
    assert "root:x:0:0" not in proc.stdout and "PATH=" not in proc.stdout


def test_validate_imports_no_hook_module() -> None:
    proc = subprocess.run([sys.executable, "-m", "engine.cli", "validate",
                           "tests/corpus/f501_hook_imports_nothing"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "F506" in proc.stdout and "this.x" in proc.stdout  # the standard library
    assert "Beautiful is better than ugly" not in proc.stdout + proc.stderr
