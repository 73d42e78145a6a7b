"""On CUDA, attention layers, the whole model and its training step never wait for the device: the batch's
layout is built once on the host, passed to every layer, and its edges are checked there.

A host sync (``.item()``, a blocking copy, ``nonzero``) stalls the CPU until the GPU catches up; with
many small graphs per batch the launches then no longer overlap the arithmetic. Under
``torch.cuda.set_sync_debug_mode("error")`` every sync raises, so a passing forward and backward has none.
"""

from __future__ import annotations

import pytest
import torch

from kmipgt.nn.attention import build_global_attention
from kmipgt.nn.gps_layer import GPSLayer
from kmipgt.ops.ragged import RaggedLayout
from kmipgt.train import load_config
from kmipgt.train.batches import forward
from kmipgt.train.datasets import prepare_data
from kmipgt.train.loop import Trainer
from kmipgt.train.losses import compute_loss
from kmipgt.train.stand_in import stand_in_data
from kmipgt.train.tasks.base import Step

pytestmark = pytest.mark.cuda


def _molecules(device: torch.device, num_graphs: int = 12, channels: int = 32):
    """A batch of ring-shaped graphs of 20-39 nodes on ``device``, its CPU ``ptr`` and its layout."""
    gen = torch.Generator().manual_seed(0)
    sizes = torch.randint(20, 40, (num_graphs,), generator=gen)
    ptr = torch.cat([torch.zeros(1, dtype=torch.long), sizes.cumsum(0)])
    rows = torch.arange(int(ptr[-1]))
    graph = torch.repeat_interleave(torch.arange(num_graphs), sizes)
    start, size = ptr[graph], sizes[graph]
    ring = start + (rows - start + 1) % size
    edge_index = torch.cat([torch.stack([rows, ring]), torch.stack([ring, rows])], dim=1)
    x = torch.randn(rows.numel(), channels, generator=gen)
    layout = RaggedLayout(ptr.pin_memory(), device)
    return x.to(device).requires_grad_(), edge_index.to(device), graph.to(device), layout


def _without_syncs(run) -> None:
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        run()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


@pytest.mark.parametrize("kind", ["kmip", "full"])
def test_attention_forward_and_backward_never_sync(kind):
    device = torch.device("cuda")
    x, edge_index, batch, layout = _molecules(device)
    attention = build_global_attention(kind, 32, heads=4, attn_kwargs={"k": 5} if kind == "kmip" else None)
    attention = attention.to(device)
    attention(x, edge_index, batch=batch, layout=layout).sum().backward()  # warm-up: kernels compile
    x.grad = None

    def run():
        attention(x, edge_index, batch=batch, layout=layout).sum().backward()

    _without_syncs(run)
    assert x.grad is not None and bool(torch.isfinite(x.grad).all())


@pytest.mark.parametrize("kind", ["kmip", "full"])
def test_gps_layer_forward_and_backward_never_sync(kind):
    device = torch.device("cuda")
    x, edge_index, batch, layout = _molecules(device)
    options = {"heads": 4, "k": 5} if kind == "kmip" else {"heads": 4}
    layer = GPSLayer(32, local="gatedgcn", attention=kind, attn_kwargs=options).to(device)
    edge_attr = torch.randn(edge_index.shape[1], 32, device=device)
    layer(x, edge_index, batch=batch, edge_attr=edge_attr, layout=layout)[0].sum().backward()
    x.grad = None

    def run():
        layer(x, edge_index, batch=batch, edge_attr=edge_attr, layout=layout)[0].sum().backward()

    _without_syncs(run)
    assert x.grad is not None and bool(torch.isfinite(x.grad).all())


# The attention kinds whose training step tests/train/test_step_syncs.py checks on CPU.
STEP_KINDS = ["kmip", "full", "none", "performer"]


def _peptides_steps(tmp_path, attention: str) -> tuple[Trainer, Step]:
    """The shipped Peptides-func model on CUDA, after one warm-up step, and a further training step: a new
    batch of 8 stand-in molecules moved as the training loop moves it (its layout and tables are new)."""
    options = [f"out_dir={tmp_path}", "device=cuda", "data.batch_size=8", f"model.attention={attention}"]
    config = load_config("peptides_func", options)
    trainer = Trainer(config, data=prepare_data(config, raw=stand_in_data(config, 16)))
    warm_up, step = list(trainer.task.train_steps(trainer.device))
    trainer.train_step(warm_up)  # kernels compile, the optimiser's state is created
    return trainer, step


@pytest.mark.parametrize("attention", STEP_KINDS)
def test_graph_transformer_forward_and_backward_never_sync(tmp_path, attention):
    trainer, step = _peptides_steps(tmp_path, attention)
    trainer.optimizer.zero_grad()

    def run():
        output = forward(trainer.model, step.batch)
        compute_loss(trainer.config.task.loss, output, step.batch.y).backward()

    _without_syncs(run)
    grads = [p.grad for p in trainer.model.parameters() if p.grad is not None]
    assert grads and all(bool(torch.isfinite(grad).all()) for grad in grads)


@pytest.mark.parametrize("attention", STEP_KINDS)
def test_training_step_never_syncs(tmp_path, attention):
    trainer, step = _peptides_steps(tmp_path, attention)
    result = []
    _without_syncs(lambda: result.append(trainer.train_step(step)))
    (total, count), = result
    assert count == 8 and bool(torch.isfinite(total))
