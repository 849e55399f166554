"""BPE trained on the training split (deterministic, cached in the result folder), local transformers tokenizers."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("tokenizers")

from sentinel import runner  # noqa: E402
from sentinel.data import Dataset, prepare, vocab_size  # noqa: E402
from sentinel.data import tokenizer as tk  # noqa: E402
from sentinel.model import dims  # noqa: E402
from tests.conftest import tiny  # noqa: E402

BPE = ("data.source=text", "data.tokenizer=bpe", "data.bpe_vocab=512")


@pytest.fixture(autouse=True)
def fresh_process_cache(monkeypatch):
    monkeypatch.setattr(tk, "_TRAINED", {})
    monkeypatch.setattr("sentinel.data.text._STREAMS", {})


def _count_training(monkeypatch) -> list:
    calls = []
    real = tk._train_bpe

    def counting(*args):
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(tk, "_train_bpe", counting)
    return calls


def test_bpe_is_deterministic_and_sees_only_the_training_split(tmp_path):
    train = ["the quick brown fox jumps over the lazy dog " * 20]
    a, b = tk.bpe(train, 300), tk.bpe(list(train), 300)
    assert a.tok.to_str() == b.tok.to_str() and a.key == b.key
    tk._TRAINED.clear()
    again = tk.bpe(train, 300)
    assert again.tok.to_str() == a.tok.to_str()  # trained anew: the same merges
    assert tk.bpe(train + ["more text"], 300).key != a.key  # the key follows the training text
    # the held-out text is never seen: two corpora that differ only in their validation tail share one tokenizer
    head = "shared training text with many words " * 40
    for name, tail in (("a", "validation text one! " * 12), ("b", "other held-out words " * 12)):
        (tmp_path / f"{name}.txt").write_text(head + tail)
    tk._TRAINED.clear()
    for name in "ab":
        sc = tiny(*BPE, f"data.path={tmp_path / name}.txt", "data.val_fraction=0.15")
        d = Dataset(sc)
        assert d.vocab == 512 == vocab_size(sc) == dims(sc).vocab  # the model's vocabulary follows the tokenizer
    assert len(tk._TRAINED) == 1


def test_bpe_tokens_round_trip_and_compress(tmp_path):
    tok = tk.bpe(["hello world, hello tokenizer " * 50], 300)
    ids = tok.encode(["hello world"])[0]
    assert tok.tok.decode(ids.tolist()) == "hello world" and len(ids) < len("hello world")


def test_prepare_keeps_the_tokenizer_in_the_result_folder_and_runs_reuse_it(tmp_path, monkeypatch):
    calls = _count_training(monkeypatch)
    sc = tiny(*BPE)
    prepare(sc, tmp_path)
    files = list(tmp_path.glob("tokenizer-bpe-*.json"))
    assert len(files) == 1 and len(calls) == 1
    tk._TRAINED.clear()  # a new process (a resumed run, a sweep point): the file is read, nothing is trained
    monkeypatch.setattr("sentinel.data.text._STREAMS", {})
    prepare(sc, tmp_path)
    Dataset(sc, cache_dir=tmp_path)
    assert len(calls) == 1


def test_a_run_and_its_twins_train_the_tokenizer_once(tmp_path, monkeypatch):
    calls = _count_training(monkeypatch)
    sc = tiny(
        *BPE, "training.steps=2", "training.eval_every=2", "scoring.twins=[clean, undefended]", "detector.name=sentinel"
    )
    summary = runner.run(sc, tmp_path / "out", progress=False)
    assert len(calls) == 1 and len(list((tmp_path / "out").glob("tokenizer-bpe-*.json"))) == 1
    assert summary["training"]["steps"] == 2


def test_a_local_transformers_tokenizer(tmp_path):
    transformers = pytest.importorskip("transformers")
    base = tk.bpe(["a local tokenizer folder, saved by transformers " * 30], 300)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=base.tok, eos_token=tk.EOT)
    fast.save_pretrained(tmp_path / "tok")
    sc = tiny("data.source=text", "data.tokenizer=hf", f"data.tokenizer_path={tmp_path / 'tok'}")
    assert vocab_size(sc) == len(fast) == dims(sc).vocab
    d = Dataset(sc)
    hf = tk.hf_tokenizer(str(tmp_path / "tok"))
    assert hf.eos == base.eos and np.array_equal(hf.encode(["saved by"])[0], base.encode(["saved by"])[0])
    assert d.train_batch(0).max() < len(fast)
    assert json.loads((tmp_path / "tok" / "tokenizer.json").read_text())["model"]["type"] == "BPE"
