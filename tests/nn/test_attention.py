"""Global attention modules against independent dense references, on single graphs and ragged batches."""

import math

import pytest
import torch
import torch.nn.functional as F

from kmipgt.nn import (
    ATTENTION_KINDS,
    FullAttention,
    KMIPAttention,
    PerformerAttention,
    build_global_attention,
)
from kmipgt.ops import topk_inner_product

SIZES = (7, 1, 12, 5)


def _ragged(sizes=SIZES, channels=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(sum(sizes), channels, generator=gen)
    batch = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
    return x, batch


def _k_for(kind: str, k: int) -> dict | None:
    """``k`` is an option of the k-MIP core only."""
    return {"k": k} if kind == "kmip" else None


def _ring_edges(batch: torch.Tensor) -> torch.Tensor:
    """Both directions of a ring inside each graph (GRF needs edges; the other kinds ignore them)."""
    edges = []
    for g in batch.unique():
        nodes = (batch == g).nonzero().flatten()
        if nodes.numel() > 1:
            edges.append(torch.stack([nodes, nodes.roll(1)]))
    edge_index = torch.cat(edges, dim=1)
    return torch.cat([edge_index, edge_index.flip(0)], dim=1)


def _dense_kmip_reference(module: KMIPAttention, x: torch.Tensor, k: int | None) -> torch.Tensor:
    """One graph: dense scores, keep the k largest per query (all if k is None), SDPA with that mask."""
    n, h, d = x.size(0), module.heads, module.head_dim
    q = module.lin_query(x).view(n, h, d).transpose(0, 1)
    kk = module.lin_key(x).view(n, h, d).transpose(0, 1)
    v = module.lin_value(x).view(n, h, d).transpose(0, 1)
    mask = torch.ones(h, n, n, dtype=torch.bool)
    if k is not None and k < n:
        top = (q @ kk.transpose(1, 2)).topk(k, dim=-1).indices
        mask = torch.zeros(h, n, n, dtype=torch.bool).scatter(-1, top, True)
    out = F.scaled_dot_product_attention(q, kk, v, attn_mask=mask)
    return module.lin_out(out.transpose(0, 1).reshape(n, h * d))


@pytest.mark.parametrize("k", [1, 3, 50])
def test_kmip_attention_matches_dense_top_k_softmax(k):
    torch.manual_seed(0)
    module = KMIPAttention(16, heads=2, k=k).eval()
    x, _ = _ragged((12,))
    torch.testing.assert_close(module(x), _dense_kmip_reference(module, x, k), atol=1e-5, rtol=1e-4)


def test_full_attention_matches_sdpa():
    torch.manual_seed(0)
    module = FullAttention(16, heads=4).eval()
    x, _ = _ragged((20,))
    torch.testing.assert_close(module(x), _dense_kmip_reference(module, x, None), atol=1e-5, rtol=1e-4)


def _dense_performer_reference(module: PerformerAttention, x: torch.Tensor) -> torch.Tensor:
    """One graph: explicit FAVOR+ features, the full N×N kernel matrix, row-normalised."""
    n, h, d = x.size(0), module.heads, module.head_dim
    q = module.lin_query(x).view(n, h, d) * d**-0.25
    kk = module.lin_key(x).view(n, h, d) * d**-0.25
    v = module.lin_value(x).view(n, h, d)
    w = module.core.projection.double()

    def phi(t):
        t = t.double()
        return torch.exp(t @ w.t() - 0.5 * (t * t).sum(-1, keepdim=True)) / math.sqrt(w.size(0))

    kernel = torch.einsum("ihm,jhm->hij", phi(q), phi(kk))
    attn = kernel / kernel.sum(-1, keepdim=True)
    out = torch.einsum("hij,jhd->ihd", attn, v.double()).float()
    return module.lin_out(out.reshape(n, h * d))


def test_performer_matches_dense_random_feature_kernel():
    torch.manual_seed(0)
    module = PerformerAttention(16, heads=2, num_features=32).eval()
    x, _ = _ragged((15,))
    torch.testing.assert_close(module(x), _dense_performer_reference(module, x), atol=1e-4, rtol=1e-3)


def test_performer_redraw_changes_projection():
    torch.manual_seed(0)
    module = PerformerAttention(16, heads=2)
    before = module.core.projection.clone()
    module.core.redraw_projection()
    assert not torch.equal(before, module.core.projection)
    # orthogonal rows within each block of head_dim rows (with Gaussian norms)
    block = F.normalize(module.core.projection[: module.head_dim], dim=1)
    torch.testing.assert_close(block @ block.t(), torch.eye(module.head_dim), atol=1e-5, rtol=0)


# GRF samples random walks per graph, so a graph alone gets other walks than inside a batch.
@pytest.mark.parametrize("kind", [k for k in ATTENTION_KINDS.names() if k not in ("none", "grf")])
def test_ragged_batch_equals_each_graph_alone(kind):
    torch.manual_seed(0)
    module = build_global_attention(kind, 16, heads=4, attn_kwargs=_k_for(kind, 3)).eval()
    x, batch = _ragged()
    together = module(x, batch=batch)
    alone = torch.cat([module(x[batch == g]) for g in range(len(SIZES))])
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("kind", [k for k in ATTENTION_KINDS.names() if k != "none"])
def test_shapes_and_gradients(kind):
    torch.manual_seed(0)
    dropout = 0.0 if kind == "grf" else 0.1
    module = build_global_attention(
        kind, 16, heads=2, head_dim=5, dropout=dropout, attn_kwargs=_k_for(kind, 4)
    ).train()
    x, batch = _ragged()
    x.requires_grad_(True)
    out = module(x, batch=batch, edge_index=_ring_edges(batch))
    assert out.shape == x.shape
    out.square().sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    for name, param in module.named_parameters():
        assert param.grad is not None and param.grad.abs().sum() > 0, name


def test_factory_and_argument_errors():
    assert build_global_attention("none", 16, 4) is None
    with pytest.raises(ValueError, match="attention kind"):
        build_global_attention("flash", 16, 4)
    with pytest.raises(ValueError, match="no attention dropout"):
        build_global_attention("grf", 16, 4, dropout=0.1)
    with pytest.raises(TypeError, match="FullCore takes no options"):
        build_global_attention("full", 16, 4, attn_kwargs={"k": 4})
    with pytest.raises(ValueError, match="divisible"):
        KMIPAttention(10, heads=4, k=2)
    with pytest.raises(ValueError, match="k must be"):
        KMIPAttention(16, heads=4, k=0)
    with pytest.raises(ValueError, match="x must have shape"):
        KMIPAttention(16, heads=4, k=2)(torch.randn(5, 8))


def test_kmip_attention_under_autocast_selects_the_float32_keys():
    """Under bf16 autocast the queries and keys come from float32 projections: k=5 selects the keys of the
    float32 module, and the output is off only by the bf16 rounding of the values and the weighted sum
    (bf16 projections would select other near-tied keys: about 8% off here)."""
    torch.manual_seed(0)
    attention = build_global_attention("kmip", 64, heads=4, attn_kwargs={"k": 5})
    x, batch = torch.randn(600, 64), torch.tensor([0] * 250 + [1] * 350)
    query, key = attention.query_key(x)
    expected = attention(x, batch=batch)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        query_bf16, key_bf16 = attention.query_key(x)
        out = attention(x, batch=batch)
    assert query_bf16.dtype == key_bf16.dtype == torch.float32
    selected = topk_inner_product(query, key, 5, batch=batch, backend="dense")[1]
    torch.testing.assert_close(topk_inner_product(query_bf16, key_bf16, 5, batch=batch, backend="dense")[1],
                               selected, rtol=0, atol=0)
    relative = float((out.float() - expected).norm() / expected.norm())
    assert out.dtype == torch.bfloat16 and relative < 4 * 2**-8


@pytest.mark.parametrize("kind", ["kmip", "full"])
def test_values_without_a_projection_work_under_autocast(kind):
    """The identity value projection leaves the values in float32 under autocast, where a projection would
    make them bf16: the attention operators cast them (their autocast policy)."""
    torch.manual_seed(0)
    options = {"k": 4} if kind == "kmip" else {}
    attention = build_global_attention(kind, 16, heads=2, attn_kwargs={"value_projection": False, **options})
    x, batch = torch.randn(30, 16), torch.tensor([0] * 12 + [1] * 18)
    expected = attention(x, batch=batch)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = attention(x, batch=batch)
    assert out.dtype == torch.bfloat16 and bool(torch.isfinite(out).all())
    tolerance = 2**-6 * float(expected.abs().max())
    torch.testing.assert_close(out.float(), expected, rtol=2**-6, atol=tolerance)
