"""``distributed.strategy: graph`` on 2 gloo ranks trains a node-level model on one graph as one process does:
same losses, metrics and final parameters (every dropout off)."""

import csv
import itertools
import json
import os
import re
import sys
from pathlib import Path

import pytest
import torch

from graph_runs import (
    GRAPH_OVERRIDES,
    first_step_gradients,
    graph_config,
    graph_runs,
    one_sided_config,
    one_sided_graph,
    one_sided_runs,
)
from kmipgt.distributed.graph_model import ShardedKMIPCore
from kmipgt.distributed.partition import block_offsets, partition_order
from kmipgt.nn import KMIPCore
from kmipgt.train import load_config, train
from kmipgt.train.checkpoint import load_checkpoint
from kmipgt.train.validation import validate_config
from spawn_ranks import run_torchrun, spawn_ranks

pytestmark = pytest.mark.distributed

TESTS = Path(__file__).resolve().parents[1]
# The shipped recipe (GatedGCN, LayerNorm, spatial partition), and BatchNorm + SAGE on the stored order with
# training labels as inputs (drawn over the whole graph) and activation checkpointing (the recomputed
# forward exchanges the halo and the key blocks again, in backward).
VARIANTS = {
    "gatedgcn": [],
    "sage_batch_norm": [
        "model.local=sage", "model.norm=batch", "distributed.partition=contiguous", "task.label_inputs=0.5",
        "model.checkpoint=true",
    ],
}
# The forward under bf16 autocast (global BatchNorm statistics in bf16, buffers float32).
BF16 = ["optim.precision=bf16"]


# Parameters whose true gradient is zero (a BatchNorm after them, or the softmax over a query's keys, removes
# a shift of them): AdamW turns the float noise of that zero into steps of ±lr, so they differ from one
# process (and the running means with them) while what the model computes does not.
SHIFT_INVARIANT = ("local.lin_a.bias", "local.lin_b.bias", "norm_node.running_mean", "attention.lin_key.bias")


def _log(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "log.csv") as f:
        return list(csv.DictReader(f))


def _column(run_dir: Path, name: str) -> list[float]:
    return [float(row[name]) for row in _log(run_dir)]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """Run directories of the single-process references (``strategy: none``), by variant."""
    dirs = {name: tmp_path_factory.mktemp(f"one_{name}") for name in [*VARIANTS, "bf16"]}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KMIPGT_CACHE", str(tmp_path_factory.mktemp("cache_one")))
        for name, overrides in {**VARIANTS, "bf16": BF16}.items():
            train(graph_config(str(dirs[name]), "none", *overrides), progress=False, overwrite=True)
    return dirs


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """Run directories of the spawned 2-rank ``strategy: graph`` runs, by variant, and ``resumed``: the first
    variant stopped after 2 epochs and resumed."""
    dirs = {name: tmp_path_factory.mktemp(f"graph_{name}") for name in [*VARIANTS, "bf16"]}
    runs = [(str(dirs[name]), overrides) for name, overrides in {**VARIANTS, "bf16": BF16}.items()]
    dirs["resumed"] = tmp_path_factory.mktemp("graph_resumed")
    spawn_ranks(graph_runs, 2, str(tmp_path_factory.mktemp("cache")), runs, str(dirs["resumed"]))
    return dirs


@pytest.mark.parametrize("variant", VARIANTS)
def test_losses_and_metrics_equal_one_process(one_process, two_ranks, variant):
    expected, got = one_process[variant], two_ranks[variant]
    assert len(_log(got)) == len(_log(expected)) == 3
    for name in ("train_loss", "val", "test"):
        assert _column(got, name) == pytest.approx(_column(expected, name), rel=1e-4), name


def test_bf16_losses_follow_one_process(one_process, two_ranks):
    """bf16 rounds differently where the ranks sum in another order: close, not equal."""
    want = _column(one_process["bf16"], "train_loss")
    assert _column(two_ranks["bf16"], "train_loss") == pytest.approx(want, rel=2e-3)


def test_final_parameters_equal_one_process(one_process, two_ranks):
    want, have = (load_checkpoint(d["gatedgcn"] / "last.pt")["model"] for d in (one_process, two_ranks))
    assert want.keys() == have.keys()  # the partitioned model's checkpoints load into one process's
    for key in want:
        if not key.endswith(SHIFT_INVARIANT):
            torch.testing.assert_close(have[key], want[key], rtol=1e-4, atol=1e-5, msg=key)


@pytest.mark.parametrize("variant", VARIANTS)
def test_first_step_gradients_equal_one_process(one_process, two_ranks, variant):
    """Summed over the ranks, every parameter's gradient is one process's, shift-invariant ones included."""
    config = graph_config(str(one_process[variant]), "none", *VARIANTS[variant])
    want, have = first_step_gradients(config), torch.load(two_ranks[variant] / "gradients.pt")
    assert len(want) > 20 and want.keys() == have.keys()
    for key in want:
        torch.testing.assert_close(have[key], want[key], rtol=1e-4, atol=1e-6, msg=key)


def test_resume_equals_the_uninterrupted_run(two_ranks):
    for name in ("train_loss", "val", "test"):
        want = _column(two_ranks["gatedgcn"], name)
        assert _column(two_ranks["resumed"], name) == pytest.approx(want, rel=1e-6), name


def test_a_rank_without_training_nodes_still_trains_as_one_process(tmp_path, monkeypatch):
    """Rank 1 holds no training node (its loss term is zero, its backward still exchanges), rank 0 no
    validation or test node."""
    graph, (order, offsets) = one_sided_graph(), partition_order(60, 2, "auto", None)
    assert not graph.train_mask[order[offsets[1]:]].any() and not graph.val_mask[order[:offsets[1]]].any()
    spawn_ranks(one_sided_runs, 2, str(tmp_path / "cache"), str(tmp_path / "graph"))
    monkeypatch.setattr("kmipgt.train.datasets.load_raw", lambda config: one_sided_graph())
    train(one_sided_config(str(tmp_path / "one"), "none"), progress=False)
    for name in ("train_loss", "val", "test"):
        assert _column(tmp_path / "graph", name) == pytest.approx(_column(tmp_path / "one", name), rel=1e-4)


def test_metrics_record_each_ranks_peak_memory(two_ranks):
    metrics = json.loads((two_ranks["gatedgcn"] / "metrics.json").read_text())
    assert len(metrics["peak_memory_mb_per_rank"]) == 2
    assert metrics["peak_memory_mb"] == metrics["peak_memory_mb_per_rank"][0] > 0


def test_torchrun_runs_the_command_on_two_ranks(tmp_path, one_process):
    out = tmp_path / "run"
    sets = [arg for item in [*GRAPH_OVERRIDES, f"out_dir={out}"] for arg in ("--set", item)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "KMIPGT_CACHE": str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join(sys.path)}
    args = ["--nproc-per-node", "2", "-m", "kmipgt", "train", "--no-progress",
            "--config", "synthetic_city_graphgps", *sets, "--set", "distributed.strategy=graph"]
    result = run_torchrun(args, env, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    want = _column(one_process["gatedgcn"], "train_loss")
    assert _column(out, "train_loss") == pytest.approx(want, rel=1e-4)


def test_example_bytes_sent_equal_the_formula(tmp_path):
    """``examples/graph_partition_volume.py``: halo and attention bytes per layer, counted and by formula."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "KMIPGT_CACHE": str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join(sys.path)}
    sets = [arg for item in GRAPH_OVERRIDES for arg in ("--set", item)]
    example = TESTS.parent / "examples" / "graph_partition_volume.py"
    args = ["--nproc-per-node", "2", str(example), "--config", "synthetic_city_graphgps", *sets]
    result = run_torchrun(args, env, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    pairs = re.findall(r"measured\s+([\d,]+)\s+formula\s+([\d,]+)", result.stdout)
    assert len(pairs) == 6 and int(pairs[0][0].replace(",", "")) > 0
    assert all(measured == formula for measured, formula in pairs), result.stdout


def test_partitions_are_balanced_blocks_of_nearby_nodes():
    coords = torch.rand(103, 2, generator=torch.Generator().manual_seed(0)) * torch.tensor([4.0, 1.0])
    order, offsets = partition_order(103, 3, "auto", coords)
    assert offsets == block_offsets(103, 3) == [0, 34, 68, 103]
    assert sorted(order.tolist()) == list(range(103))
    blocks = [coords[order[a:b]] for a, b in itertools.pairwise(offsets)]
    # the first cut is across x, the widest coordinate: one rank left of it, two right of it
    assert blocks[0][:, 0].max() <= min(blocks[1][:, 0].min(), blocks[2][:, 0].min())
    assert torch.equal(partition_order(103, 3, "auto", coords)[0], order)  # every rank computes the same
    assert torch.equal(partition_order(103, 3, "contiguous", coords)[0], torch.arange(103))
    assert torch.equal(partition_order(103, 3, "auto", None)[0], torch.arange(103))
    with pytest.raises(ValueError, match="needs node coordinates"):
        partition_order(103, 3, "spatial", None)
    with pytest.raises(ValueError, match="every rank needs a node"):
        partition_order(2, 3, "contiguous", None)


@pytest.mark.parametrize(("overrides", "message"), [
    (["task.level=graph"], r"task\.level: node\), got task\.level 'graph'"),
    (["model.attention=full"], r"model\.attention\.kind .*must be one of \('kmip', 'none'\), got 'full'"),
    (["model.attention=performer"], r"model\.attention\.kind .*got 'performer'"),
    (["model.local=gcn"], r"model\.local .*got 'gcn'"),
    (["model.kind=gcn"], r"GPS models \(model\.kind: gps\), got 'gcn'"),
    (["log_branches=true"], r"'log_branches' is not supported"),
    (["model.norm=graph"], r"model\.norm 'graph' normalises each graph as a whole"),
    (["distributed.partition=metis"], r"distributed\.partition' must be one of"),
])
def test_unsupported_combinations_are_refused(overrides, message):
    with pytest.raises(ValueError, match=message):
        validate_config(load_config(None, ["distributed.strategy=graph", *overrides]))


def test_approximate_search_and_a_launch_without_torchrun_are_refused(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="searches every rank's keys exactly"):
        ShardedKMIPCore(KMIPCore(2, 4, k=4, backend="ivf", nprobe=2))
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match="runs under torchrun"):
        train(graph_config(str(tmp_path / "run"), "graph"), progress=False)
