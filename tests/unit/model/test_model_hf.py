"""Transformers models split into stages: exact against the unsplit model, through the engine too."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from sentinel.engine.sim import SimEngine  # noqa: E402
from sentinel.model import build_stages, describe, dims, global_parameters, loss_fn, num_params  # noqa: E402
from sentinel.model.hf import build_model  # noqa: E402
from tests.unit.model.hf_tiny import CONFIGS, hf_tiny  # noqa: E402

FAMILIES = sorted(CONFIGS)


def _chain(stages, x):
    for s in stages:
        x = s(x)
    return x


@pytest.mark.parametrize("family", FAMILIES)
def test_stages_compute_the_unsplit_models_own_logits_and_loss(family):
    """Position ids, rotary tables, causal and sliding-window masks rebuilt per stage: same logits, same loss."""
    sc = hf_tiny(family)
    model = build_model(sc.model, 32, seed=0)
    x = torch.randint(0, 32, (3, 17), generator=torch.Generator().manual_seed(1))  # B, T+1
    ref_logits = model(input_ids=x[:, :-1]).logits  # B, T, V
    ref_loss = model(input_ids=x, labels=x).loss  # transformers shifts the labels itself
    for S in (1, 2, 4):
        stages = build_stages(sc.model, 32, S, seed=0)
        logits = _chain(stages, x[:, :-1])
        torch.testing.assert_close(logits, ref_logits, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(loss_fn(logits, x[:, 1:]), ref_loss, rtol=1e-5, atol=1e-6)
        assert [s.first for s in stages] == [True] + [False] * (S - 1)
        assert [s.last for s in stages] == [False] * (S - 1) + [True]


def _train(sc):
    eng = SimEngine(sc)
    return eng, [eng.train_step() for _ in range(sc.training.steps)]


@pytest.mark.parametrize("family", FAMILIES)
def test_four_stages_equal_one_stage_through_the_engine(family):
    e1, l1 = _train(hf_tiny(family, "pipeline.stages=1"))
    e4, l4 = _train(hf_tiny(family, "pipeline.stages=4"))
    torch.testing.assert_close(torch.tensor(l4), torch.tensor(l1), rtol=1e-5, atol=1e-6)
    p1, p4 = e1.parameters(), e4.parameters()
    assert p1.keys() == p4.keys() and any(k.endswith("layers.3.mlp.down_proj.weight") or ".h.3." in k for k in p1)
    for k in p1:
        torch.testing.assert_close(p4[k], p1[k], rtol=1e-5, atol=1e-5, msg=k)
    assert l1[-1] < l1[0] - 0.2  # it trains
    torch.testing.assert_close(e4.evaluate(), e1.evaluate(), rtol=1e-5, atol=1e-6)


def _tied_pair(eng):
    first = eng.replicas[eng.workers.live_in_stage(0)[0]].module
    last = eng.replicas[eng.workers.live_in_stage(eng.num_stages - 1)[0]].module
    return first.input_embedding().weight, last.tied_head()


def test_gpt2_tied_copies_stay_identical_and_need_the_hook(monkeypatch):
    """Megatron's rule (sum the two gradients after DP sync) keeps S=4 on S=1; without it S=4 drifts away."""
    sc = hf_tiny("gpt2", "pipeline.stages=4", "pipeline.replicas=2")
    assert dims(sc).tied
    eng, _ = _train(sc)
    embed, head = _tied_pair(eng)
    assert head is not None and head is not embed and torch.equal(embed, head)
    e1, _ = _train(hf_tiny("gpt2", "pipeline.stages=1", "pipeline.replicas=2"))
    torch.testing.assert_close(embed, e1.parameters()["transformer.wte.weight"], rtol=1e-5, atol=1e-5)

    monkeypatch.setattr("sentinel.engine.step.model_hooks", lambda sc: [])
    untied, _ = _train(sc)
    embed_u, head_u = _tied_pair(untied)
    assert not torch.allclose(embed_u, head_u, atol=1e-4)  # the comparison above is not vacuous
    assert not torch.allclose(embed_u, e1.parameters()["transformer.wte.weight"], atol=1e-4)


class _DropAllGradientsAtBoundary0:
    """A responder that drops every gradient crossing boundary 0: stage 0 never gets a backward."""

    def deliver(self, msg, verdict, substitute=None):
        return None if (msg.boundary == 0 and msg.role == 1) else msg.payload

    def end_step(self, step, records):
        pass


class _AcceptAll:
    def observe(self, msg):
        from sentinel.detectors import Verdict

        return Verdict({}, False)

    def substitute(self, msg):
        return None


def test_tied_copy_follows_the_side_that_stepped():
    """Only the last stage has a gradient: stage 0 does not step, so the hook copies weight and optimizer state."""
    sc = hf_tiny("gpt2", "pipeline.stages=4", "training.steps=2")
    eng = SimEngine(sc, verifier=_AcceptAll(), responder=_DropAllGradientsAtBoundary0())
    before = _tied_pair(eng)[0].clone()
    for _ in range(2):
        eng.train_step()
    embed, head = _tied_pair(eng)
    assert not torch.equal(embed, before) and torch.equal(embed, head)
    first = eng.replicas[eng.workers.live_in_stage(0)[0]]
    last = eng.replicas[eng.workers.live_in_stage(3)[0]]
    for key, value in last.optimizer.state[head].items():
        assert torch.equal(first.optimizer.state[embed][key], value), key


def test_weights_depend_on_the_seed_only():
    sc = hf_tiny("llama")
    torch.manual_seed(123)
    a = global_parameters(build_stages(sc.model, 32, 1, seed=5))
    torch.manual_seed(456)  # transformers' own init draws from the global RNG: it must not matter
    b = global_parameters(build_stages(sc.model, 32, 4, seed=5))
    c = global_parameters(build_stages(sc.model, 32, 1, seed=6))
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)
    state = torch.random.get_rng_state()
    build_stages(sc.model, 32, 2, seed=5)
    assert torch.equal(torch.random.get_rng_state(), state)  # the global RNG is left as it was


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_a_saved_checkpoint_loads_offline_with_the_same_weights(tmp_path, family):
    sc = hf_tiny(family)
    model = build_model(sc.model, 32, seed=3)
    model.save_pretrained(tmp_path / "ckpt")  # config.json + model.safetensors
    loaded = hf_tiny(family, "model.hf.config=null", f"model.hf.path={tmp_path / 'ckpt'}", "pipeline.stages=2")
    assert dims(loaded).vocab == 32 and dims(loaded).tied == (family == "gpt2")
    stages = build_stages(loaded.model, 32, 2, seed=0)  # the seed does not matter for a checkpoint
    want = dict(model.named_parameters())
    got = global_parameters(stages)
    assert got.keys() == want.keys()
    assert all(torch.equal(got[k], want[k]) for k in want)
    x = torch.randint(0, 32, (2, 16))
    torch.testing.assert_close(_chain(stages, x), model(input_ids=x).logits)


@pytest.mark.parametrize("family", FAMILIES)
def test_describe_counts_parameters_without_building_weights(family):
    sc = hf_tiny(family, "pipeline.stages=4")
    info = describe(sc)
    model = build_model(sc.model, 32, seed=0)
    stages = build_stages(sc.model, 32, 4, seed=0)
    assert info["params_total"] == sum(p.numel() for p in model.parameters())
    assert info["params_per_stage"] == [num_params([s]) for s in stages]
    assert info["layers_per_stage"] == [1, 1, 1, 1] and info["hidden"] == 32 and info["vocab"] == 32
    assert info["activation_bytes_per_message"] == 4 * 16 * 32 * 4  # B, T, C float32
    if family == "gpt2":  # the last stage holds its own copy of the tied embedding
        assert sum(info["params_per_stage"]) == info["params_total"] + 32 * 32


@pytest.mark.parametrize("family", FAMILIES)
def test_projected_residual_writers_keep_the_stream_in_the_subspace(family):
    """After project_residual_(P), h - E[tokens] lies in span(P) at every boundary (the subspace codec's premise)."""
    sc = hf_tiny(family)
    stages = build_stages(sc.model, 32, 2, seed=0)
    U, _ = torch.linalg.qr(torch.randn(32, 8, generator=torch.Generator().manual_seed(0)))
    P = U @ U.T  # C, C
    for s in stages:
        s.project_residual_(P)
    x = torch.randint(0, 32, (2, 16))
    h = stages[0](x) - stages[0].input_embedding()(x)  # B, T, C
    assert (h - h @ P).abs().max() < 1e-5 < h.abs().max()


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_the_subspace_codec_is_lossless_on_transformers_stages(family):
    """The subspace codec's weight projection through the Stage interface (GPT-2: Conv1D, positions, tied copy)."""
    from sentinel.transport.message import Role
    from tests.scenarios.test_compression import _Check, _Recorder, steps

    rec = _Recorder()
    check = _Check(rec)
    sc = hf_tiny(family, "transport.codec={name: subspace, rate: 4, project_weights: true}")
    eng = SimEngine(sc, adversary=rec, verifier=check)
    steps(eng, 3)
    acts = [e for e, r in zip(check.err, eng.log.messages["role"]) if r == Role.ACTIVATION]
    assert len(acts) == 3 * 3 * 4 and max(acts) < 1e-4
    if family == "gpt2":
        embed, head = _tied_pair(eng)
        assert torch.equal(embed, head)
