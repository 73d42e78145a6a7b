"""Regularisers of the attention branch: k-MIP's key dropout and stochastic depth of the branch."""

import itertools

import pytest
import torch
import torch.nn.functional as F

from kmipgt.distributed.graph_model import ShardedKMIPCore
from kmipgt.nn import GPSLayer, KMIPCore
from kmipgt.train import build_model, load_config
from kmipgt.train.datasets import PreparedData

SIZES = (120, 80, 100)


def _tokens(seed=0, heads=2, dim=4):
    gen = torch.Generator().manual_seed(seed)
    n = sum(SIZES)
    batch = torch.repeat_interleave(torch.arange(len(SIZES)), torch.tensor(SIZES))
    q, k, v = (torch.randn(n, heads, dim, generator=gen) for _ in range(3))
    return q, k, v, batch


def _sdpa_over(q, k, v, keys):
    """Softmax attention of every query ``[M, H, d]`` over the key rows ``keys``, per head."""
    out = F.scaled_dot_product_attention(q.transpose(0, 1), k[keys].transpose(0, 1), v[keys].transpose(0, 1))
    return out.transpose(0, 1)


@pytest.mark.parametrize("ragged", [True, False])
def test_key_dropout_attends_over_the_kept_keys_only(ragged):
    q, k, v, batch = _tokens()
    v.requires_grad_(True)
    if not ragged:
        batch = None
    graphs = [torch.arange(q.size(0))] if batch is None else [
        torch.arange(lo, hi) for lo, hi in itertools.pairwise([0, *itertools.accumulate(SIZES)])
    ]
    core = KMIPCore(2, 4, k=sum(SIZES), key_dropout=0.5)
    core.keep_attention = True
    torch.manual_seed(3)
    out = core.train()(q, k, v, batch=batch)
    index = core.last_attention.index
    kept_all = []
    for rows in graphs:
        chosen = index[rows]
        # k is at least the graph's size, so each query selects every key that stayed in the search.
        kept = chosen[0, 0][chosen[0, 0] >= 0].sort().values
        for head in range(2):
            selected = chosen[:, head].sort(-1).values[:, -kept.numel():]
            assert torch.equal(selected, kept.expand(rows.numel(), -1))
        assert ((kept >= rows[0]) & (kept <= rows[-1])).all()
        assert 0.3 * rows.numel() < kept.numel() < 0.7 * rows.numel()
        torch.testing.assert_close(out[rows], _sdpa_over(q[rows], k, v, kept), atol=1e-5, rtol=1e-4)
        kept_all.append(kept)
    out.sum().backward()
    dropped = torch.ones(q.size(0), dtype=torch.bool)
    dropped[torch.cat(kept_all)] = False
    assert (v.grad[dropped] == 0).all() and (v.grad[~dropped] != 0).any(-1).all()
    full = core.eval()(q, k, v, batch=batch)
    for rows in graphs:
        torch.testing.assert_close(full[rows], _sdpa_over(q[rows], k, v, rows), atol=1e-5, rtol=1e-4)


def test_key_dropout_is_checked_and_not_sharded():
    with pytest.raises(ValueError, match="key_dropout"):
        KMIPCore(2, 4, key_dropout=1.0)
    assert "key_dropout=0.25" in repr(KMIPCore(2, 4, key_dropout=0.25))
    with pytest.raises(ValueError, match="key_dropout"):
        ShardedKMIPCore(KMIPCore(2, 4, key_dropout=0.25))


def _gated_layer(drop_path: float, gate: float, seed=0) -> GPSLayer:
    torch.manual_seed(seed)
    layer = GPSLayer(
        16, local="gat", attention="kmip", branch_residual=False, ffn=False,
        attn_kwargs={"gate": True, "drop_path": drop_path, "k": 8},
    )
    with torch.no_grad():
        layer.attention_gate.fill_(gate)
    return layer


def test_attention_drop_path_drops_whole_nodes_of_the_branch():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(200, 16, generator=gen)
    edge_index = torch.randint(0, 200, (2, 800), generator=gen)
    torch.manual_seed(5)
    out = _gated_layer(0.5, 1.0).train()(x, edge_index)[0]
    # Reference layers with the same weights and no stochastic depth: the branch off, or scaled by 1/(1-p).
    local_only = _gated_layer(0.0, 0.0).train()(x, edge_index)[0]
    scaled = _gated_layer(0.0, 2.0).train()(x, edge_index)[0]
    as_local = torch.isclose(out, local_only, atol=1e-6).all(-1)
    as_scaled = torch.isclose(out, scaled, atol=1e-5).all(-1)
    assert (as_local ^ as_scaled).all()
    assert 60 < int(as_local.sum()) < 140
    torch.testing.assert_close(
        _gated_layer(0.5, 1.0).eval()(x, edge_index)[0], _gated_layer(0.0, 1.0).eval()(x, edge_index)[0]
    )
    with pytest.raises(ValueError, match="drop_path must be in"):
        GPSLayer(16, attn_kwargs={"drop_path": 1.0})


def test_config_keys_reach_the_layers_and_the_core():
    config = load_config(
        None,
        ["model.attention.drop_path=0.3", "model.attention.options={key_dropout: 0.2}", "model.num_layers=2"],
    )
    data = PreparedData("node", None, None, in_channels=5, edge_channels=1, out_channels=3, name="x")
    model = build_model(config, data)
    assert [layer.attention_drop_path for layer in model.layers] == [0.3, 0.3]
    assert [layer.attention.core.key_dropout for layer in model.layers] == [0.2, 0.2]
