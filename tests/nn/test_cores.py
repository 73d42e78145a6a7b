"""Attention cores behind one projection, attn_kwargs passed down untouched, and k-MIP in PyG's GPSConv."""

import itertools

import pytest
import torch
import torch.nn.functional as F
from torch_geometric.nn import GINConv, GPSConv

from kmipgt.nn import (
    ATTENTION_KINDS,
    FullAttention,
    GPSLayer,
    GraphTransformer,
    KMIPAttention,
    KMIPGPSConv,
    PerformerAttention,
)
from kmipgt.train.config import load_config
from kmipgt.train.validation import validate_config

SIZES = (9, 4, 6)


def _batch(channels=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    ptr = [0, *itertools.accumulate(SIZES)]
    batch = torch.repeat_interleave(torch.arange(len(SIZES)), torch.tensor(SIZES))
    edge_index = torch.cat(
        [torch.randint(lo, hi, (2, 2 * (hi - lo)), generator=gen) for lo, hi in itertools.pairwise(ptr)], 1
    )
    return torch.randn(ptr[-1], channels, generator=gen), edge_index, batch


def _dense_topk_attention(
    module: KMIPAttention, x: torch.Tensor, batch: torch.Tensor, k: int
) -> torch.Tensor:
    """Per graph: dense scores, the k largest per query and head kept, SDPA with that mask, out projection."""
    h, d = module.heads, module.head_dim
    rows = []
    for g in batch.unique():
        xg = x[batch == g]
        n = xg.size(0)
        q, kk, v = (
            lin(xg).view(n, h, -1).transpose(0, 1)
            for lin in (module.lin_query, module.lin_key, module.lin_value)
        )
        top = (q @ kk.transpose(1, 2)).topk(min(k, n), dim=-1).indices
        mask = torch.zeros(h, n, n, dtype=torch.bool).scatter(-1, top, True)
        rows.append(
            F.scaled_dot_product_attention(q, kk, v, attn_mask=mask).transpose(0, 1).reshape(n, h * d)
        )
    return module.lin_out(torch.cat(rows))


def _gin(channels=16):
    return GINConv(torch.nn.Sequential(torch.nn.Linear(channels, channels), torch.nn.ReLU()))


def test_cores_take_the_same_tokens_and_kmip_with_k_at_least_n_is_full_attention():
    torch.manual_seed(0)
    _, edge_index, batch = _batch()
    q, k, v = (torch.randn(batch.numel(), 2, 4) for _ in range(3))
    outputs = {}
    for kind, spec in ATTENTION_KINDS.items():
        core = spec.core_class
        options = {"k": max(SIZES)} if kind == "kmip" else {}
        outputs[kind] = core(2, 4, **options).eval()(q, k, v, edge_index, batch)
        assert outputs[kind].shape == v.shape, kind
    expected = torch.cat(
        [
            F.scaled_dot_product_attention(*(t[batch == g].transpose(0, 1) for t in (q, k, v))).transpose(
                0, 1
            )
            for g in range(len(SIZES))
        ]
    )
    torch.testing.assert_close(outputs["full"], expected, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(outputs["kmip"], expected, atol=1e-5, rtol=1e-4)


def test_attn_kwargs_reach_every_core_untouched():
    options = {"k": 3, "backend": "ivf", "nlist": 2, "nprobe": 1}
    model = GraphTransformer(5, 16, 2, num_layers=2, attention="kmip", attn_kwargs=dict(options))
    for layer in model.layers:
        core = layer.attention.core
        assert (core.k, core.backend, core.search) == (3, "ivf", {"nlist": 2, "nprobe": 1})
    x, edge_index, batch = _batch(channels=5)
    assert model(x, edge_index, batch).shape == (x.size(0), 2)
    layer = GPSLayer(16, attention="grf", attn_kwargs={"num_walks": 2, "max_len": 3, "seed": 7})
    assert (layer.attention.core.num_walks, layer.attention.core.max_len, layer.attention.core.seed) == (
        2,
        3,
        7,
    )
    with pytest.raises(TypeError, match="nlsit"):
        GraphTransformer(5, 16, 2, attn_kwargs={"k": 3, "nlsit": 2})
    with pytest.raises(TypeError, match="PerformerCore"):
        GPSLayer(16, attention="performer", attn_kwargs={"k": 3})


def test_config_k_reaches_only_the_kmip_core():
    config = load_config(None, ["model.attention.k=5", "model.attention.options={backend: dense}"])
    assert config.model.attention.core_options() == {"k": 5, "backend": "dense"}
    config = load_config(None, ["model.attention=performer", "model.attention.options={num_features: 8}"])
    assert config.model.attention.core_options() == {"num_features": 8}
    with pytest.raises(ValueError, match=r"model\.attention\.k"):
        validate_config(load_config(None, ["model.attention.options={k: 4}"]))


@pytest.mark.parametrize("kind", ["kmip", "full", "performer", "grf"])
def test_queries_and_keys_can_be_narrower_than_values(kind):
    x, edge_index, batch = _batch()
    options = {"k": 4} if kind == "kmip" else {}
    module = ATTENTION_KINDS.lookup(kind).module_class(16, heads=2, head_dim=5, qk_dim=3, **options).eval()
    assert (module.lin_query.out_features, module.lin_key.out_features) == (6, 6)
    query, key, value = module.query_key_value(x)
    assert (query.shape[-1], key.shape[-1], value.shape[-1]) == (3, 3, 5)
    out = module(x, edge_index, batch)
    assert out.shape == x.shape
    if kind in ("kmip", "full"):  # logits scaled by 1/sqrt(qk_dim), as SDPA scales by the query width
        k = options.get("k", max(SIZES))
        torch.testing.assert_close(out, _dense_topk_attention(module, x, batch, k))


def test_config_attention_options_set_the_query_key_width():
    config = load_config(None, ["model.attention.options={qk_dim: 4}", "model.attention.heads=2"])
    model = GraphTransformer(5, 16, 2, num_layers=2, attn_kwargs=config.model.attention.attn_kwargs())
    assert {layer.attention.qk_dim for layer in model.layers} == {4}
    assert {layer.attention.head_dim for layer in model.layers} == {8}


def test_projection_state_dict_is_shared_by_the_kinds():
    keys = {f"lin_{name}.{p}" for name in ("query", "key", "value", "out") for p in ("weight", "bias")}
    assert set(KMIPAttention(16, heads=2).state_dict()) == keys
    assert set(FullAttention(16, heads=2).state_dict()) == keys
    assert set(PerformerAttention(16, heads=2).state_dict()) == keys | {"core.projection"}


@pytest.mark.parametrize("training", [False, True])
def test_gps_conv_with_full_attention_equals_pyg_gpsconv(training):
    torch.manual_seed(0)
    x, edge_index, batch = _batch()
    ours = KMIPGPSConv(16, _gin(), heads=4, attn_type="full")
    theirs = GPSConv(16, ours.conv, heads=4)
    theirs.load_state_dict(ours.state_dict(), strict=False)  # the local conv, MLP and norms
    attention = ours.attn
    with torch.no_grad():
        lins = (attention.lin_query, attention.lin_key, attention.lin_value)
        theirs.attn.in_proj_weight.copy_(torch.cat([lin.weight for lin in lins]))
        theirs.attn.in_proj_bias.copy_(torch.cat([lin.bias for lin in lins]))
        theirs.attn.out_proj.load_state_dict(attention.lin_out.state_dict())
    ours.train(training)
    theirs.train(training)
    torch.testing.assert_close(ours(x, edge_index, batch), theirs(x, edge_index, batch), atol=1e-5, rtol=1e-4)


def test_gps_conv_with_kmip_equals_hand_computation_and_uses_the_attention():
    torch.manual_seed(0)
    x, edge_index, batch = _batch()
    conv = KMIPGPSConv(16, _gin(), heads=2, attn_kwargs={"k": 3}).eval()
    assert isinstance(conv, GPSConv) and isinstance(conv.attn, KMIPAttention) and conv.attn.k == 3
    h_local = conv.norm1(x + conv.conv(x, edge_index))
    h_attn = conv.norm2(x + _dense_topk_attention(conv.attn, x, batch, 3))
    h = h_local + h_attn
    expected = conv.norm3(h + conv.mlp(h))
    out = conv(x, edge_index, batch)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4)
    # Skipping the attention (what PyG's GPSConv does with a module it does not know) would not see this.
    with torch.no_grad():
        conv.attn.lin_value.weight.mul_(2.0)
    assert not torch.allclose(conv(x, edge_index, batch), out, atol=1e-3)


def test_gps_conv_reset_and_argument_errors():
    conv = KMIPGPSConv(12, None, heads=5, attn_kwargs={"k": 2, "head_dim": 4})
    assert conv.heads == 5 and conv.attn.head_dim == 4 and "attn_type=kmip" in repr(conv)
    before = conv.attn.lin_query.weight.clone()
    conv.reset_parameters()
    assert not torch.equal(before, conv.attn.lin_query.weight)
    with pytest.raises(ValueError, match="attn_type"):
        KMIPGPSConv(16, None, attn_type="multihead")


@pytest.mark.parametrize("kind", ["kmip", "full", "performer", "grf"])
def test_without_value_projection_the_values_are_the_input_channels(kind):
    x, edge_index, batch = _batch()
    options = {"kmip": {"k": 4}, "grf": {"seed": 0}}.get(kind, {})
    bare = ATTENTION_KINDS.lookup(kind).module_class(16, heads=2, value_projection=False, **options).eval()
    assert not any(name.startswith("lin_value") for name, _ in bare.named_parameters())
    torch.testing.assert_close(bare.query_key_value(x)[2], x.view(-1, 2, 8))
    # The same module with an identity W_V (and zero bias) is an independent computation of the same thing.
    projected = ATTENTION_KINDS.lookup(kind).module_class(16, heads=2, **options).eval()
    projected.load_state_dict(bare.state_dict(), strict=False)
    with torch.no_grad():
        projected.lin_value.weight.copy_(torch.eye(16))
        projected.lin_value.bias.zero_()
    out = bare(x, edge_index, batch)
    assert out.isfinite().all()
    torch.testing.assert_close(out, projected(x, edge_index, batch))
    assert "value_projection=False" in repr(bare)


def test_value_projection_off_needs_heads_times_head_dim_channels():
    with pytest.raises(ValueError, match="heads \\* head_dim == channels"):
        KMIPAttention(16, heads=2, head_dim=5, value_projection=False)


def test_config_attention_options_drop_the_value_projection():
    overrides = ["model.attention.options={value_projection: false}", "model.attention.heads=2"]
    config = load_config(None, overrides)
    kwargs = config.model.attention.attn_kwargs()
    with_values = GraphTransformer(5, 16, 2, num_layers=2, attn_kwargs={"heads": 2, "k": 16})
    without = GraphTransformer(5, 16, 2, num_layers=2, attn_kwargs=kwargs)
    count = sum(p.numel() for p in with_values.parameters()) - sum(p.numel() for p in without.parameters())
    assert count == 2 * (16 * 16 + 16)
    assert all(isinstance(layer.attention.lin_value, torch.nn.Identity) for layer in without.layers)
