"""The reference CLIP tokenizer (open_clip's), run in its own venv as a long-lived process.

open_clip is never installed in the project venv: it pins torchvision and timm. The
oracle venv gets open_clip_torch without dependencies and only what its tokenizer
module imports; that module is loaded by file path so open_clip/__init__ (which
wants torchvision) is never run. One process answers many requests over a pipe,
so a hypothesis test can ask per example without paying interpreter start-up.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.venvs import oracle_python

OPEN_CLIP_VERSION = "3.3.0"
# regex is pinned to the project venv's version: its Unicode tables decide what is a letter.
CLIP_REF_PACKAGES = (
    f"open_clip_torch=={OPEN_CLIP_VERSION}", "ftfy==6.3.1", "wcwidth", "regex==2026.11.19", "numpy",
    "torch==2.13.0", "typing-extensions", "filelock", "sympy", "mpmath", "networkx", "jinja2",
    "MarkupSafe", "fsspec",
)

_SERVER = r"""
import importlib.util, json, pathlib, sys, sysconfig
path = pathlib.Path(sysconfig.get_paths()["purelib"]) / "open_clip" / "tokenizer.py"
spec = importlib.util.spec_from_file_location("ref_tokenizer", path)
ref = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ref)
out = sys.stdout
out.write(json.dumps({"ready": str(path)}) + "\n"); out.flush()
for line in sys.stdin:
    req = json.loads(line)
    try:
        if req["op"] == "tokenize":
            result = ref.tokenize(req["texts"], context_length=req["ctx"]).tolist()
        elif req["op"] == "encode":
            result = [ref._tokenizer.encode(t) for t in req["texts"]]
        elif req["op"] == "decode":
            result = [ref._tokenizer.decode(ids) for ids in req["ids"]]
        else:
            raise ValueError(req["op"])
        reply = {"result": result}
    except Exception as e:
        reply = {"error": repr(e)}
    out.write(json.dumps(reply) + "\n"); out.flush()
"""


def reference_python() -> Path:
    return oracle_python("clip-ref", CLIP_REF_PACKAGES, pip_args=("--no-deps",))


class ReferenceTokenizer:
    """Client of the reference process. Strings travel as JSON (lone surrogates survive \\u escapes)."""

    def __init__(self, python: Path) -> None:
        self._proc = subprocess.Popen(
            [str(python), "-c", _SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            encoding="ascii",
        )
        hello = json.loads(self._proc.stdout.readline() or "{}")
        if "ready" not in hello:
            raise RuntimeError("reference tokenizer process failed to start")

    def _ask(self, **request):
        self._proc.stdin.write(json.dumps(request) + "\n")
        self._proc.stdin.flush()
        reply = json.loads(self._proc.stdout.readline())
        if "error" in reply:
            raise RuntimeError(f"reference tokenizer raised {reply['error']}")
        return reply["result"]

    def tokenize(self, texts: list[str], context_length: int = 77) -> list[list[int]]:
        return self._ask(op="tokenize", texts=texts, ctx=context_length)

    def encode(self, texts: list[str]) -> list[list[int]]:
        return self._ask(op="encode", texts=texts)

    def decode(self, ids: list[list[int]]) -> list[str]:
        return self._ask(op="decode", ids=ids)

    def close(self) -> None:
        self._proc.stdin.close()
        self._proc.wait(timeout=30)
