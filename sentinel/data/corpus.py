"""Text corpora: read documents from a file, a folder or a JSONL file, and split them train / validation.

    (no path)     Python's bundled documentation (`pydoc_data.topics`, ~460 kB): no download
    FILE          one text file
    DIR           every regular, non-hidden file under it (recursively, sorted by path): one document each
    FILE.jsonl    one JSON object per non-empty line; its `text_field` (default "text") is a document

Documents are kept as bytes (the byte tokenizer needs no decoding). The split: a corpus of one
document (the built-in text, a file, a folder with one file) holds out its tail (`val_fraction` of
its bytes); a corpus of several documents holds out whole documents, a seeded `val_fraction` of them
(at least one), so no document is in both splits. Every problem is a `ConfigError` at `data.path`,
with the file, the line for JSONL, the rule and a fix.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import stat
from pathlib import Path

import numpy as np

from sentinel.errors import ConfigError

JSONL_SUFFIXES = (".jsonl", ".ndjson")


@dataclasses.dataclass(frozen=True)
class Corpus:
    documents: tuple[bytes, ...]
    origin: str  # for messages: the path, or "the built-in corpus"

    @property
    def nbytes(self) -> int:
        return sum(len(d) for d in self.documents)


@dataclasses.dataclass(frozen=True)
class Split:
    train: tuple[bytes, ...]
    val: tuple[bytes, ...]


def read_corpus(path: str | None, text_field: str = "text") -> Corpus:
    """The documents of `data.path` (cached per file version: validate, twins and runs read it once)."""
    if path is None:
        return _builtin()
    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        raise ConfigError(
            f"data.path: file not found: {path!r}; give a text file, a folder of text files or a JSONL file"
        ) from None
    except (OSError, ValueError) as exc:  # permission, a name too long, a NUL byte
        raise ConfigError(f"data.path: cannot read {path!r}: {getattr(exc, 'strerror', None) or exc}") from None
    if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
        raise ConfigError(
            f"data.path: {path!r} is not a regular file (a device, a pipe, ...); give a text file, "
            "a folder of text files or a JSONL file"
        )
    return _read(str(p), text_field, st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=4)
def _read(path: str, text_field: str, mtime_ns: int, size: int) -> Corpus:
    p = Path(path)
    if p.is_dir():
        docs = tuple(_read_bytes(f) for f in _files_under(p))
    elif p.suffix.lower() in JSONL_SUFFIXES:
        docs = _read_jsonl(p, text_field)
    else:
        docs = (_read_bytes(p),)
    corpus = Corpus(tuple(d for d in docs if d), path)
    if not corpus.documents:
        raise ConfigError(f"data.path: {path} has 0 bytes of text; give a non-empty corpus")
    return corpus


@functools.lru_cache(maxsize=1)
def _builtin() -> Corpus:
    import pydoc_data.topics

    text = "\n\n".join(pydoc_data.topics.topics[k] for k in sorted(pydoc_data.topics.topics))
    return Corpus((text.encode("utf-8"),), "the built-in corpus")


def _files_under(folder: Path) -> list[Path]:
    files = []
    for root, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        files += [Path(root) / n for n in sorted(names) if not n.startswith(".") and (Path(root) / n).is_file()]
    if not files:
        raise ConfigError(f"data.path: the folder {folder} holds no files; put text files in it")
    return files


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"data.path: cannot read {str(path)!r}: {exc.strerror}; check its permissions") from None


def _read_jsonl(path: Path, field: str) -> tuple[bytes, ...]:
    docs = []
    for lineno, line in enumerate(_read_bytes(path).splitlines(), 1):
        if not line.strip():
            continue
        where = f"data.path: {path} line {lineno}"
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise ConfigError(f"{where}: invalid JSON ({exc}); every line must be one JSON object") from None
        if not isinstance(obj, dict) or field not in obj:
            keys = f" (its keys: {', '.join(map(str, obj))})" if isinstance(obj, dict) else ""
            raise ConfigError(f"{where}: no {field!r} field{keys}; set data.text_field to the key holding the text")
        if not isinstance(obj[field], str):
            raise ConfigError(f"{where}: {field!r} is {type(obj[field]).__name__}, not a string")
        docs.append(obj[field].encode("utf-8"))
    return tuple(docs)


def split(corpus: Corpus, val_fraction: float, seed: int, char_boundary: bool = False) -> Split:
    """Train / validation documents: the tail of a single document, or a seeded share of whole documents.

    `char_boundary` moves a tail cut off the middle of a UTF-8 character (for text tokenizers).
    """
    docs = corpus.documents
    if len(docs) == 1:
        raw = docs[0]
        cut = int(len(raw) * (1 - val_fraction))
        while char_boundary and 0 < cut < len(raw) and raw[cut] & 0xC0 == 0x80:  # a UTF-8 continuation byte
            cut += 1
        return Split((raw[:cut],), (raw[cut:],))
    n_val = min(len(docs) - 1, max(1, math.ceil(val_fraction * len(docs))))
    order = np.random.default_rng([seed, 0xD0C5]).permutation(len(docs))
    held = set(order[:n_val].tolist())
    return Split(
        tuple(d for i, d in enumerate(docs) if i not in held), tuple(d for i, d in enumerate(docs) if i in held)
    )


def decode(split_: Split, origin: str) -> tuple[list[str], list[str]]:
    """The documents as text (BPE and transformers tokenizers read UTF-8 text)."""
    out = []
    for part in (split_.train, split_.val):
        texts = []
        for doc in part:
            try:
                texts.append(doc.decode("utf-8"))
            except UnicodeDecodeError as exc:
                raise ConfigError(
                    f"data.path: {origin} is not UTF-8 text (byte {exc.start} of a document: "
                    f"{exc.reason}); re-encode it, or use data.tokenizer: bytes"
                ) from None
        out.append(texts)
    return out[0], out[1]
