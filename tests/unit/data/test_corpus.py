"""Corpora from a file, a folder or JSONL: documents, the split by document, and located errors (exit 2)."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from sentinel.cli import main
from sentinel.data import Dataset, TextSource, read_corpus, split
from sentinel.errors import ConfigError
from tests.conftest import tiny

TEXT = [
    "alpha beta gamma " * 40,
    "delta epsilon " * 50,
    "zeta eta theta " * 45,
    "iota kappa " * 60,
    "lambda mu nu " * 55,
    "xi omicron pi " * 50,
]


def _jsonl(path: Path, docs, field="text") -> Path:
    path.write_text("\n".join(json.dumps({field: d, "id": i}) for i, d in enumerate(docs)) + "\n\n")
    return path


def test_folder_and_jsonl_give_the_same_documents(tmp_path):
    folder = tmp_path / "docs"
    (folder / "sub").mkdir(parents=True)
    for i, d in enumerate(TEXT):
        (folder / ("sub" if i % 2 else ".") / f"{i}.txt").write_text(d)
    (folder / ".hidden").write_text("not a document")
    by_folder = read_corpus(str(folder))
    by_jsonl = read_corpus(str(_jsonl(tmp_path / "c.jsonl", TEXT)))
    assert sorted(by_folder.documents) == sorted(d.encode() for d in TEXT) == sorted(by_jsonl.documents)
    other = read_corpus(str(_jsonl(tmp_path / "o.jsonl", TEXT, field="body")), "body")
    assert other.documents == by_jsonl.documents


def test_several_documents_split_by_document_with_the_seed(tmp_path):
    corpus = read_corpus(str(_jsonl(tmp_path / "c.jsonl", TEXT)))
    a, b, c = split(corpus, 0.34, seed=0), split(corpus, 0.34, seed=0), split(corpus, 0.34, seed=1)
    assert a == b and len(a.val) == 3 and len(a.train) == 3  # ceil(0.34 * 6) documents held out
    assert not set(a.train) & set(a.val) and set(a.train) | set(a.val) == set(corpus.documents)
    assert {a.val, c.val} != {a.val}  # another seed holds out other documents (for these two seeds)
    one = split(corpus, 0.01, seed=0)
    assert len(one.val) == 1  # at least one document


def test_a_single_text_holds_out_its_tail(tmp_path):
    p = tmp_path / "t.txt"
    p.write_bytes(bytes(range(256)) * 10)
    parts = split(read_corpus(str(p)), 0.25, seed=0)
    assert parts.val == (p.read_bytes()[-640:],)


def test_documents_are_joined_by_a_separator_and_windows_stay_in_their_split(tmp_path):
    src = TextSource(str(_jsonl(tmp_path / "c.jsonl", TEXT)), seq_len=8, val_fraction=0.34, seed=0)
    parts = split(read_corpus(str(tmp_path / "c.jsonl")), 0.34, seed=0)
    assert bytes(src.val.astype(np.uint8)) == b"\n\n".join(parts.val)
    assert bytes(src.train.astype(np.uint8)) == b"\n\n".join(parts.train)


def _validate(tmp_path, capsys, data_section: dict, **model) -> str:
    sc = {
        "model": {"layers": 2, "dim": 32, "heads": 2, "seq_len": 16, **model},
        "data": {"source": "text", "batch_size": 4, **data_section},
        "pipeline": {"stages": 2},
    }
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(sc))
    code = main(["validate", str(path)])
    out = capsys.readouterr()
    assert code == 2 and "Traceback" not in out.err
    return out.err


def test_an_empty_corpus(tmp_path, capsys):
    (tmp_path / "e.txt").write_text("")
    assert f"data.path: {tmp_path / 'e.txt'} has 0 bytes" in _validate(
        tmp_path, capsys, {"path": str(tmp_path / "e.txt")}
    )
    (tmp_path / "d").mkdir()
    assert "holds no files" in _validate(tmp_path, capsys, {"path": str(tmp_path / "d")})


def test_a_missing_or_unreadable_corpus(tmp_path, capsys, monkeypatch):
    assert "data.path: file not found: '/no/such.txt'" in _validate(tmp_path, capsys, {"path": "/no/such.txt"})
    p = tmp_path / "locked.txt"
    p.write_text("x" * 1000)

    def deny(self):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "read_bytes", deny)  # chmod does not stop root
    assert f"data.path: cannot read {str(p)!r}: Permission denied" in _validate(tmp_path, capsys, {"path": str(p)})


def test_a_corpus_smaller_than_one_batch(tmp_path, capsys):
    p = tmp_path / "small.txt"
    p.write_text("x" * 60)  # 54 training bytes; one batch needs 4 x 17 = 68
    err = _validate(tmp_path, capsys, {"path": str(p)})
    assert "data.path: " in err and "the training split one batch (batch_size x (seq_len + 1) = 68)" in err


def test_jsonl_errors_name_their_line(tmp_path, capsys):
    p = tmp_path / "c.jsonl"
    p.write_text('{"text": "fine"}\n\n{"body": "no text field"}\n')
    assert f"data.path: {p} line 3: no 'text' field (its keys: body); set data.text_field" in _validate(
        tmp_path, capsys, {"path": str(p)}
    )
    p.write_text('{"text": "fine"}\n{"text": "broken\n')
    assert f"data.path: {p} line 2: invalid JSON" in _validate(tmp_path, capsys, {"path": str(p)})
    p.write_text('{"text": 3}\n')
    assert f"data.path: {p} line 1: 'text' is int, not a string" in _validate(tmp_path, capsys, {"path": str(p)})


def test_text_tokenizers_need_utf8(tmp_path, capsys):
    pytest.importorskip("tokenizers")
    p = tmp_path / "latin1.txt"
    p.write_bytes("caf\xe9 ".encode("latin-1") * 500)
    err = _validate(tmp_path, capsys, {"path": str(p), "tokenizer": "bpe", "bpe_vocab": 300})
    assert "is not UTF-8 text" in err and "use data.tokenizer: bytes" in err


def test_keys_that_need_a_text_source(tmp_path, capsys):
    sc = {"data": {"source": "synthetic", "tokenizer": "bpe"}}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(sc))
    assert main(["validate", str(path)]) == 2
    assert "data.tokenizer: only used with data.source: text" in capsys.readouterr().err


def test_the_dataset_checks_the_tokenized_size_too(tmp_path):
    pytest.importorskip("tokenizers")
    p = tmp_path / "rep.txt"
    p.write_text("abc" * 300)  # 900 bytes pass the byte bound; BPE folds the one long word into a few tokens
    sc = tiny("data.source=text", f"data.path={p}", "data.tokenizer=bpe", "data.bpe_vocab=300", "model.vocab=300")
    with pytest.raises(ConfigError, match=r"validation bpe tokens .* the training split one batch"):
        Dataset(sc)


def test_without_the_extra_text_tokenizers_exit_2_with_the_install_command(tmp_path, capsys, monkeypatch):
    real = importlib.import_module

    def missing(name, *args):  # only the extra's packages are missing (scipy and the rest import lazily too)
        if name.split(".")[0] in ("tokenizers", "transformers"):
            raise ImportError(name)
        return real(name, *args)

    monkeypatch.setattr("sentinel.data.tokenizer.importlib.import_module", missing)
    err = _validate(tmp_path, capsys, {"tokenizer": "bpe"})
    assert "data.tokenizer: 'bpe' needs the optional transformers extra: pip install -e '.[hf]'" in err
