"""Token sources for training: a seeded Markov source with a known optimum, or text corpora with a tokenizer.

Dataset(scenario)        per-step batches (M, B, T+1) and a fixed validation set
vocab_size(scenario)     the data's vocabulary, without tokenizing anything
check(scenario)          located problems with the data section (run by `validate`)
prepare(scenario, dir)   a BPE tokenizer trained once and kept in the result folder
"""

from sentinel.data.corpus import Corpus, read_corpus, split
from sentinel.data.dataset import Dataset, check, prepare, tokenizer_path, uniform_loss, vocab_size
from sentinel.data.markov import MarkovSource
from sentinel.data.text import TextSource

__all__ = [
    "Corpus",
    "Dataset",
    "MarkovSource",
    "TextSource",
    "check",
    "prepare",
    "read_corpus",
    "split",
    "tokenizer_path",
    "uniform_loss",
    "vocab_size",
]
