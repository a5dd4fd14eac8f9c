"""Docs that cannot drift: every code name README.md and docs/*.md cite in backticks exists.

- A path in the repository (`src/convert/verify.py`, `shell/train_*.sh`, `tests/e2e/`) is a tracked
  file or folder, or a glob that matches one.
- A bare file name (`launch.py`) is a tracked file's name; in a list item that starts with a
  folder (`src/training/`: ... (`launch.py`)) it is a file under that folder (or a command at the
  repository's root, `dali.py`).
- A name tied to a file (`dataloaders/base.py:select_captions`, `DaliLoader._images` in
  `dataloaders/imagenet.py`, `src/convert/writer.py` (`ShardWriter`)) is defined in that file; a
  dotted name that starts with a module (`src.devices.resolve_device`, `recordio.record_in`) is
  defined in that module.
- Any other name that reads as code (`snake_case`, `CamelCase`, `a.b`) is a word of the code.

Read with `ast` and plain text, so nothing is imported. Code blocks (```) are examples, not read.
"""

from __future__ import annotations

import ast
import fnmatch
import re
import subprocess
from functools import cache
from pathlib import Path

from tests._repo import REPO

DOCS = ("README.md", *sorted(p.relative_to(REPO).as_posix() for p in (REPO / "docs").glob("*.md")))

# Names of other projects the docs compare against, by document: not ours, so not in the code.
FOREIGN = {
    "docs/evaluation.md": {"metric_mean_per_class_accuracy", "text_image_retrieval.py"},  # the original's
    "docs/gpu.md": {"GLOO_SOCKET_IFNAME"},  # an environment variable gloo reads
    # open_clip's, which we lack
    "docs/model.md": {
        "VisionTransformer",
        "output_dim",
        "logit_bias",
        "forward_intermediates",
        "no_weight_decay",
        "text_projection",
        "visual.proj",
        "vision_cfg",
        "text_cfg",
    },
}
_PLACEHOLDER = re.compile(r"<|\{|NNNNN|\.\.\.")
_IDENT = r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*"
_CODE_SUFFIXES = (".py", ".sh")
# A dotted name ending so is a data file's name (`coco_test_karpathy.json`), not code.
_FILE_SUFFIXES = (
    ".json",
    ".jsonl",
    ".txt",
    ".csv",
    ".tsv",
    ".log",
    ".mat",
    ".npy",
    ".pt",
    ".safetensors",
    ".png",
    ".jpg",
    ".md",
    ".toml",
    ".gz",
    ".tar",
    ".parquet",
    ".rec",
    ".idx",
)


@cache
def _tracked() -> tuple[str, ...]:
    # Files not yet added count too (a doc and the file it names may come in one commit).
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return tuple(p for p in out.splitlines() if (REPO / p).exists())


@cache
def _tracked_dirs() -> frozenset[str]:
    return frozenset(d.as_posix() for p in _tracked() for d in Path(p).parents if str(d) != ".")


@cache
def _code_words() -> frozenset[str]:
    words: set[str] = set()
    for p in _tracked():
        if p == "tests/test_docs.py":  # its own example of stale names is no use of them
            continue
        if p.endswith((".py", ".sh", ".json", ".toml")) or Path(p).name == "Makefile":
            text = (REPO / p).read_text(encoding="utf-8", errors="replace")
            words.update(re.findall(r"[A-Za-z_]\w*", text))
    return frozenset(words)


@cache
def _defined(path: str) -> frozenset[str]:
    """Names `path` defines at module level (imports included) and its classes' members as Class.name."""
    out: set[str] = set()

    def walk(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                out.add(prefix + node.name)
                if isinstance(node, ast.ClassDef):
                    walk(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                out.update(prefix + n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
            elif isinstance(node, ast.Import | ast.ImportFrom):
                out.update(prefix + (a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, ast.If | ast.Try | ast.With):
                walk(node.body, prefix)

    walk(ast.parse((REPO / path).read_text(encoding="utf-8")).body, "")
    return frozenset(out)


def _module_file(dotted: str) -> tuple[str, str] | None:
    """(file, the rest) for a dotted name of a project module (`src.devices.resolve_device`: the
    longest module prefix and what follows it), None for a name that starts elsewhere."""
    parts = dotted.split(".")
    if parts[0] not in _tracked_dirs():
        return None
    for i in range(len(parts), 0, -1):
        head = "/".join(parts[:i])
        for candidate in (f"{head}.py", f"{head}/__init__.py"):
            if candidate in _tracked():
                return candidate, ".".join(parts[i:])
    return None


def _names_in(path: str, name: str) -> bool:
    """`name` (or, for Class.member, its class) is defined in `path`, or handed on by it by name
    (a package's lazy `__getattr__` map)."""
    text = (REPO / path).read_text(encoding="utf-8")
    if {name, name.split(".")[0]} & _defined(path):
        return True
    return re.search(rf"\b{re.escape(name)}\b", text) is not None


def _is_repo_path(span: str) -> bool:
    top = span.split("/", 1)[0]
    return (
        "/" in span
        and top in _tracked_dirs()
        and not re.search(r"[\s:]", span)
        and not _PLACEHOLDER.search(span)
    )


def _path_exists(span: str) -> bool:
    path = span.rstrip("/")
    if any(c in path for c in "*?["):
        return any(fnmatch.fnmatch(p, path) for p in _tracked())
    return path in _tracked() or path in _tracked_dirs()


def _blocks(text: str) -> list[str]:
    """The document in list items and paragraphs, code blocks left out, lines joined."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    blocks, current = [], []
    for line in text.splitlines():
        starts = re.match(r"\s*(?:[-*]|\d+\.)\s", line) or line.startswith(("#", "|"))
        if (starts or not line.strip()) and current:
            blocks.append(" ".join(current))
            current = []
        if line.strip():
            current.append(line.strip())
    if current:
        blocks.append(" ".join(current))
    return blocks


def _problems(doc: str) -> list[str]:
    foreign = FOREIGN.get(doc, set())
    problems = []
    tied = [
        re.compile(rf"`(?P<file>[\w/.-]+\.py):(?P<name>{_IDENT})(?:\(\))?`"),
        re.compile(rf"`(?P<name>{_IDENT})(?:\(\))?` in `(?P<file>[\w/.-]+\.py)`"),
        re.compile(rf"`(?P<file>[\w/.-]+\.py)`(?:'s)? \(`(?P<name>{_IDENT})(?:\(\))?`"),
    ]
    for block in _blocks((REPO / doc).read_text(encoding="utf-8")):
        spans = re.findall(r"`([^`]+)`", block)
        folder = spans[0] if spans and spans[0].endswith("/") and _is_repo_path(spans[0]) else None
        for span in spans:
            if span in foreign:
                continue
            if _is_repo_path(span):
                if not _path_exists(span):
                    problems.append(f"{doc}: `{span}` is no file or folder of the repository")
            elif re.fullmatch(r"[\w.-]+(\.py|\.sh)", span):
                # Under the item's folder, or a command at the root (`dali.py`).
                if span not in _tracked() and not any(
                    p.startswith(folder or "") and Path(p).name == span for p in _tracked()
                ):
                    problems.append(f"{doc}: `{span}` is no file" + (f" under {folder}" if folder else ""))
            elif re.fullmatch(rf"{_IDENT}(\(\))?", span):
                name = span.removesuffix("()")
                looks_like_code = "_" in name or "." in name or re.search(r"[a-z][A-Z]", name)
                if not looks_like_code or name.endswith(_CODE_SUFFIXES + _FILE_SUFFIXES):
                    continue
                module = _module_file(name) if "." in name else None
                if module and module[1] and not _names_in(*module):
                    problems.append(f"{doc}: `{span}`: {module[0]} defines no {module[1]}")
                missing = [w for w in name.split(".") if w not in _code_words()]
                if missing:
                    problems.append(f"{doc}: `{span}` is named nowhere in the code")
        for pattern in tied:
            for m in pattern.finditer(block):
                file, name = m["file"], m["name"]
                if name.endswith(_CODE_SUFFIXES):
                    continue
                files = [
                    p
                    for p in _tracked()
                    if p == file or (folder and p == folder + file) or p.endswith("/" + file)
                ]
                if not any(_names_in(f, name) for f in files):
                    problems.append(f"{doc}: `{name}` is not defined in {file}")
    return problems


def test_every_code_name_the_docs_cite_exists():
    problems = [p for doc in DOCS for p in _problems(doc)]
    assert not problems, "\n".join(problems)


def test_the_check_finds_a_stale_name(tmp_path):
    """The test above fails on the names that drifted before it existed (an absolute path is read
    as it is: `REPO / path` is `path`)."""
    stale = tmp_path / "stale.md"
    stale.write_text(
        "- **The record layout**: written by `src/convert/writer.py` (`pack_record`), read by\n"
        "  `dataloaders/base.py:select_captions`; `src/inputs.py`, `read_manifest` are gone.\n"
        "- `src/training/`: the schedules (`schedule.py`, `nowhere.py`).\n"
    )
    doc = str(stale)
    assert sorted(_problems(doc)) == sorted(
        [
            f"{doc}: `pack_record` is named nowhere in the code",
            f"{doc}: `pack_record` is not defined in src/convert/writer.py",
            f"{doc}: `src/inputs.py` is no file or folder of the repository",
            f"{doc}: `read_manifest` is named nowhere in the code",
            f"{doc}: `nowhere.py` is no file under src/training/",
        ]
    )


def test_the_architecture_names_every_room():
    """docs/architecture.md names each module of src/ and dataloaders/ (src/lock.py once went unnamed)."""
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    rooms = {
        p
        for p in _tracked()
        if re.fullmatch(r"(src|dataloaders)/[^/]+\.py", p) and not p.endswith("__init__.py")
    }
    rooms |= {f"src/{d.split('/')[1]}/" for d in _tracked_dirs() if re.fullmatch(r"src/[^/]+", d)}
    unnamed = sorted(r for r in rooms if f"`{r}`" not in text and f"`{Path(r).name}`" not in text)
    assert not unnamed, f"docs/architecture.md does not name: {unnamed}"
