"""A knowledge folder cut into chunks: one per Markdown heading, within a token cap.

No database here: `engine.store.knowledge` indexes what this module reads. A chunk's
id is ``<file without .md>#<heading slug>`` (``breeds/sphynx#dry-skin``), stable
across reindexes, so a turn record can cite it.
"""

from __future__ import annotations

import hashlib
import math
import re
from pathlib import Path

from ..errors import ConfigError
from ..records.chunks import Chunk

MAX_FILE_BYTES = 1_000_000
MAX_FILES = 2000
_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
_SLUG = re.compile(r"[^\w]+", re.UNICODE)


def estimate(text: str) -> int:
    """Tokens of a text, estimated like prompts are (`engine.records.messages`): 4 characters a token."""
    return math.ceil(len(text) / 4)


def slug(text: str) -> str:
    return _SLUG.sub("-", text.lower()).strip("-")[:60] or "section"


def markdown_files(folder: Path) -> list[Path]:
    """The ``*.md`` files under ``folder``, sorted; none may lead outside it.

    Raises:
        ConfigError: a file is a link out of the folder, too large, or there are too many.
    """
    root = folder.resolve()
    files = sorted(p for p in folder.rglob("*.md") if p.is_file())
    if len(files) > MAX_FILES:
        raise ConfigError(f"knowledge folder {folder} has {len(files)} Markdown files; at most "
                          f"{MAX_FILES} are indexed: split the funnel's knowledge")
    for path in files:
        if root not in path.resolve().parents:
            raise ConfigError(f"knowledge file {path} leads outside the folder {folder}; a "
                              "funnel may only read files in its own folder: copy it in")
        if path.stat().st_size > MAX_FILE_BYTES:
            raise ConfigError(f"knowledge file {path} is larger than {MAX_FILE_BYTES} bytes; "
                              "split it into smaller files")
    return files


def chunk_text(text: str, source: str, cap: int) -> list[Chunk]:
    """Cut one Markdown text into chunks by heading; a section past ``cap`` tokens is
    cut at paragraph boundaries (a paragraph past it, at the cap)."""
    stem = source[:-3] if source.endswith(".md") else source
    sections: list[tuple[list[str], list[str]]] = []
    path: list[str] = []
    body: list[str] = []
    for line in text.splitlines():
        m = _HEADING.match(line)
        if m:
            sections.append((list(path), body))
            level = len(m.group(1))
            path = path[: level - 1] + [""] * max(0, level - 1 - len(path)) + [m.group(2)]
            body = []
        else:
            body.append(line)
    sections.append((path, body))
    out: list[Chunk] = []
    seen: dict[str, int] = {}
    for heads, lines in sections:
        content = "\n".join(lines).strip()
        if not content:
            continue
        title = " > ".join(h for h in heads if h) or stem
        for i, piece in enumerate(_pieces(content, cap)):
            key = slug(heads[-1] if heads else stem) + (f"-{i + 1}" if i else "")
            seen[key] = seen.get(key, 0) + 1
            if seen[key] > 1:
                key = f"{key}-{seen[key]}"
            out.append(Chunk(f"{stem}#{key}", source, title, piece, estimate(title + piece)))
    return out


def _pieces(content: str, cap: int) -> list[str]:
    pieces: list[str] = []
    current = ""
    for para in re.split(r"\n\s*\n", content):
        para = para.strip()
        while estimate(para) > cap:  # a paragraph past the cap: cut at a space near it
            cut = para.rfind(" ", 0, cap * 4)
            cut = cut if cut > 0 else cap * 4
            if current:
                pieces.append(current)
                current = ""
            pieces.append(para[:cut].strip())
            para = para[cut:].strip()
        joined = f"{current}\n\n{para}" if current else para
        if current and estimate(joined) > cap:
            pieces.append(current)
            current = para
        else:
            current = joined
    if current:
        pieces.append(current)
    return [p for p in pieces if p]


def chunk_folder(folder: Path, cap: int) -> tuple[list[Chunk], str]:
    """Every chunk of a knowledge folder, and a digest of its files (to skip a reindex)."""
    digest = hashlib.sha256(str(cap).encode())
    chunks: list[Chunk] = []
    for path in markdown_files(folder):
        raw = path.read_bytes()
        rel = path.relative_to(folder).as_posix()
        digest.update(rel.encode() + b"\0" + raw + b"\0")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError(f"knowledge file {path} is not UTF-8 ({exc.reason} at byte "
                              f"{exc.start}); save it as UTF-8") from None
        chunks.extend(chunk_text(text, rel, cap))
    return chunks, digest.hexdigest()
