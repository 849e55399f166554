from __future__ import annotations

import numpy as np
import pytest
import torch

from sentinel.data import Dataset, MarkovSource, TextSource
from sentinel.errors import ConfigError
from tests.conftest import tiny


@pytest.mark.parametrize("order", [1, 2])
def test_markov_optimum_matches_the_empirical_conditional_entropy(order):
    src = MarkovSource(vocab=8, order=order, concentration=0.5, seq_len=32, seed=1)
    x = src.sample(np.random.default_rng(0), 4000)  # n, T+1
    # empirical cross-entropy of the true conditional probabilities = optimum loss (law of large numbers)
    nll = []
    for t in range(1, x.shape[1]):
        k = min(order, t)
        if k < order:  # first positions: condition on a shorter context via the stationary joint
            continue
        ctx = np.zeros(len(x), dtype=np.int64)
        for j in range(t - order, t):
            ctx = ctx * 8 + x[:, j]
        nll.append(-np.log(src.probs[ctx, x[:, t]]))
    rate = float(np.mean(nll))
    full_rate = -(src.stationary[:, None] * np.where(src.probs > 0, src.probs * np.log(src.probs), 0)).sum()
    assert abs(rate - full_rate) < 0.02
    assert src.optimum_loss <= np.log(8) and src.optimum_loss >= full_rate - 1e-9


def test_markov_chain_is_stationary():
    src = MarkovSource(vocab=6, order=1, concentration=1.0, seq_len=8, seed=0)
    x = src.sample(np.random.default_rng(1), 20000)
    freq0 = np.bincount(x[:, 0], minlength=6) / len(x)
    freq8 = np.bincount(x[:, 8], minlength=6) / len(x)
    np.testing.assert_allclose(freq0, src.stationary, atol=0.015)
    np.testing.assert_allclose(freq8, src.stationary, atol=0.015)


def test_batches_depend_only_on_seed_and_step():
    a, b = Dataset(tiny()), Dataset(tiny())
    assert torch.equal(a.train_batch(7), b.train_batch(7))
    assert not torch.equal(a.train_batch(7), a.train_batch(8))
    assert a.train_batch(0).shape == (4, 4, 17)
    assert torch.equal(a.val_batches(), b.val_batches())


def test_default_text_corpus_needs_no_download():
    src = TextSource(None, seq_len=32, val_fraction=0.1)
    assert src.vocab == 256 and len(src.train) > 100_000
    x = src.sample(np.random.default_rng(0), 3, "val")
    assert x.shape == (3, 33)


def test_text_source_holds_out_the_tail(tmp_path):
    p = tmp_path / "t.txt"
    p.write_bytes(bytes(range(256)) * 10)
    src = TextSource(str(p), seq_len=8, val_fraction=0.25)
    assert len(src.val) == 640 and np.array_equal(src.val, np.frombuffer(p.read_bytes()[-640:], np.uint8))


def test_text_file_too_short_is_a_config_error(tmp_path):
    p = tmp_path / "t.txt"
    p.write_text("short")
    with pytest.raises(ConfigError, match=r"the splits each need model.seq_len \+ 2 = 66"):
        TextSource(str(p), seq_len=64, val_fraction=0.1)
