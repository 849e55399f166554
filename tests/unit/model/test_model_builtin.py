from __future__ import annotations

import pytest
import torch

from sentinel.model import build_stages, loss_fn, split_layers
from tests.conftest import tiny


@pytest.mark.parametrize("layers,stages", [(4, 4), (5, 2), (7, 3), (16, 16), (3, 1)])
def test_split_is_contiguous_and_even(layers, stages):
    parts = split_layers(layers, stages)
    assert [i for r in parts for i in r] == list(range(layers))
    sizes = [len(r) for r in parts]
    assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1


def test_weights_do_not_depend_on_the_number_of_stages():
    cfg = tiny().model
    one = build_stages(cfg, 32, 1, seed=3)[0]
    four = build_stages(cfg, 32, 4, seed=3)
    assert four[0].embed is not None and four[-1].head is not None
    assert all(s.embed is None for s in four[1:]) and all(s.head is None for s in four[:-1])
    x = torch.randint(0, 32, (2, 16))
    h = x
    for s in four:
        h = s(h)
    torch.testing.assert_close(h, one(x))
    assert h.shape == (2, 16, 32)


def test_attention_is_causal():
    stage = build_stages(tiny().model, 32, 1, seed=0)[0]
    x = torch.randint(0, 32, (1, 16))
    y = x.clone()
    y[0, 10:] = (y[0, 10:] + 1) % 32  # change only the future
    torch.testing.assert_close(stage(x)[0, :10], stage(y)[0, :10])


def test_initial_loss_is_near_uniform():
    stage = build_stages(tiny().model, 32, 1, seed=0)[0]
    x = torch.randint(0, 32, (4, 17))
    loss = loss_fn(stage(x[:, :-1]), x[:, 1:])
    assert abs(loss.item() - torch.log(torch.tensor(32.0)).item()) < 0.1
