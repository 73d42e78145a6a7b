"""A training step of the shipped Peptides-func model (and of the point-cloud recipe) never waits for the
device, checked on CPU.

On CUDA a host sync stalls the host until the device has caught up; with batches of about 200 small molecules
the launches then no longer overlap the arithmetic. :class:`sync_detector.HostSyncs` records, without a GPU,
the ops that would force one. The step is :meth:`kmipgt.train.loop.Trainer.train_step` itself (forward,
loss, backward, gradient clipping, AdamW and scheduler steps) on a stand-in batch of 8 molecule-like graphs
shaped as Peptides-func's (:mod:`kmipgt.train.stand_in`), as ``kmipgt bench step`` times it.
"""

from __future__ import annotations

import math

import pytest
import torch

from kmipgt.train import load_config
from kmipgt.train.datasets import prepare_data
from kmipgt.train.loop import Trainer
from kmipgt.train.resident import HOST_PTR
from kmipgt.train.stand_in import stand_in_data
from sync_detector import HostSyncs

GRAPHS = 8


@pytest.fixture(autouse=True)
def _keep_thread_count():
    """The trainer sets torch's thread count for the run; later tests keep their own."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def _trainer(tmp_path, *overrides: str, name: str) -> Trainer:
    options = [f"out_dir={tmp_path}", f"data.batch_size={GRAPHS}", "threads=1", *overrides]
    config = load_config(name, options)
    return Trainer(config, data=prepare_data(config, raw=stand_in_data(config, GRAPHS)))


def _on_device(trainer: Trainer, batch) -> list[torch.Tensor]:
    """What a CUDA step finds on the device: the model's parameters and buffers and the batch moved there.
    The batch's ``ptr`` and ``host_ptr`` stay out: the model reads the loader's own CPU offsets on the host
    (on CPU the moved ``ptr`` is that one too)."""
    moved = [value for key, value in batch.items() if isinstance(value, torch.Tensor)
             and key not in ("ptr", HOST_PTR)]
    return [*trainer.model.parameters(), *trainer.model.buffers(), *moved]


@pytest.mark.parametrize(
    ("name", "overrides"),
    [
        pytest.param("peptides_func", [], id="kmip"),
        pytest.param("peptides_func", ["model.attention=full"], id="full"),
        pytest.param("peptides_func", ["model.attention=none"], id="none"),
        pytest.param("peptides_func", ["model.attention=performer"], id="performer"),
        pytest.param("peptides_func", ["data.on_device=true"], id="kmip-batches-cut-on-the-device"),
        # Point-cloud segmentation: a label for every node of every graph; generated shapes, no stand-in.
        pytest.param("synthetic_parts", [f"data.options.num_shapes={GRAPHS}"], id="point-clouds"),
    ],
)
def test_a_training_step_never_waits_for_the_device(tmp_path, name, overrides):
    trainer = _trainer(tmp_path, *overrides, name=name)
    step = next(iter(trainer.task.train_steps(trainer.device)))
    with HostSyncs(_on_device(trainer, step.batch)) as syncs:
        total, count = trainer.train_step(step)
        in_step = list(syncs.syncs)
        loss = float(total)  # the training loop's read, once per epoch
    assert in_step == [], "host syncs in the training step:\n" + "\n".join(map(str, in_step))
    # The detector followed the step's values to its output: reading the loss is its one sync.
    assert [sync.op for sync in syncs.syncs] == ["aten._local_scalar_dense.default"]
    # The loss averages over graphs (Peptides-func) or over every point of the batch (segmentation).
    assert count == (GRAPHS if name == "peptides_func" else step.batch.num_nodes) and math.isfinite(loss)
