"""What a start does before the first customer: a real model is warmed up without a request.

litellm builds its response types and the OpenAI SDK its own on the first call, about a
second of CPU (bench/start.py); `Engine.open` does that work at start instead, through
litellm's own ``mock_response``, so the first customer's turn costs what the others do.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from fake_openai import FakeOpenAI

ROOT = Path(__file__).resolve().parent.parent

CODE = """
import os, sys
os.environ["OPENAI_API_KEY"] = "sk-warm"
from engine.llm.models import make_model
model = make_model("openai/gpt-4o-mini", api_base=sys.argv[1])
from openai.types.chat import ChatCompletion
print(bool(ChatCompletion.__pydantic_complete__))
model.warm()
print(bool(ChatCompletion.__pydantic_complete__))
"""


def test_a_real_model_is_warmed_up_without_a_request() -> None:
    with FakeOpenAI() as fake:
        out = subprocess.run([sys.executable, "-c", CODE, fake.api_base], capture_output=True,
                             text=True, cwd=ROOT, check=True, timeout=120).stdout.split()
        assert out == ["False", "True"]  # built by the warm-up, not before
        assert fake.calls == 0  # and nothing left the process
