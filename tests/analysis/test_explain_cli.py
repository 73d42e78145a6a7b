"""`kmipgt analysis explain` on trained runs: node-level cities and every graph of a graph-level split."""

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from kmipgt.cli import main
from kmipgt.data.lrgb import OGB_ATOM_DIMS, OGB_BOND_DIMS
from tiny_runs import train_tiny_city


def _explain_cli(capsys, *args):
    code = main(["analysis", "explain", "--no-progress", *map(str, args)])
    return code, capsys.readouterr()


@pytest.mark.slow
def test_cli_explains_a_trained_synthetic_city(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(Path(__file__).parents[2])
    run = tmp_path / "run"
    train_tiny_city(run)
    capsys.readouterr()
    out = tmp_path / "explain"
    code, printed = _explain_cli(capsys, run, "--nodes", "0,17,599", "--out", out)
    assert code == 0, printed.err
    result = json.loads((out / "explain.json").read_text())
    assert result["run"] == str(run) and result["split"] == "test" and result["k"] == 16
    assert [(e["layer"], e["head"]) for e in result["layers"]] == [
        (layer, h) for layer in (0, 1) for h in range(4)
    ]
    for entry in result["layers"]:
        assert [row["node"] for row in entry["queries"]] == [0, 17, 599]
        for row in entry["queries"]:
            assert len(row["keys"]) == 16 and isinstance(row["label"], int)
            assert math.isclose(sum(key["weight"] for key in row["keys"]), 1.0, rel_tol=1e-5)
            for key in row["keys"]:
                assert set(key) == {"node", "score", "weight", "hops", "train", "same_label"}
                assert key["hops"] is None or isinstance(key["hops"], int)
        assert set(entry["stats"]) >= {
            "hops_histogram",
            "mean_hops",
            "weight_on_train",
            "same_label_rate",
            "base_same_label_rate",
            "entropy",
            "distinct_keys",
        }
        assert list(entry["stats"]["hops_histogram"])[-1] == ">64"
        assert entry["stats"]["queries"] == result["num_queries"] == 480  # the test split: 80 % of 600
    assert set(result["mpnn_reference"]) >= {"mean_hops", "same_label_rate", "weight_on_train"}
    for name in ("explain_layer0.png", "explain_layer1.png", "explain_stats.png"):
        assert (out / name).stat().st_size > 1000

    code, _ = _explain_cli(capsys, run, "--sample", "2", "--layer", "1", "--head", "3", "--split", "val")
    assert code == 0
    sampled = json.loads((run / "explain" / "explain.json").read_text())
    assert [(e["layer"], e["head"]) for e in sampled["layers"]] == [(1, 3)]
    assert len(sampled["layers"][0]["queries"]) == 2 and sampled["num_queries"] == 60

    # Bad input: one line naming the value, exit 2, nothing written.
    no_checkpoint = tmp_path / "no_checkpoint"
    no_checkpoint.mkdir()
    shutil.copy(run / "config.yaml", no_checkpoint / "config.yaml")
    performer = tmp_path / "performer"
    train_tiny_city(performer, attention="performer")
    capsys.readouterr()
    cases = [
        ((no_checkpoint,), "best.pt"),
        ((run, "--nodes", "3,600"), "node 600"),
        ((run, "--layer", "2"), "layer 2"),
        ((run, "--head", "4"), "head 4"),
        ((performer,), "'performer'"),
        ((run, "--split", "dev"), "'dev'"),
        ((run, "--graph", "all"), "graph-level run"),
        ((run, "--graph", "all", "--nodes", "3"), "--nodes"),
    ]
    for args, named in cases:
        bad_out = tmp_path / "bad"
        code, printed = _explain_cli(capsys, *args, "--out", bad_out)
        assert code == 2, args
        assert printed.err.startswith("kmipgt: error: ") and named in printed.err, printed.err
        assert printed.err.count("\n") == 1 and not bad_out.exists()


def _peptide_copy(root: Path) -> dict[str, list[int]]:
    """A tiny local LRGB Peptides-func copy (PyG raw layout, path-like molecules); node counts per split."""
    raw = root / "peptides-func" / "raw"
    raw.mkdir(parents=True)
    gen = torch.Generator().manual_seed(0)
    sizes = {"train": [9, 14, 11, 8, 13, 10, 12, 9], "val": [10, 12], "test": [11, 7, 15, 9, 13]}
    for split, counts in sizes.items():
        molecules = []
        for n in counts:
            chain = torch.stack([torch.arange(n - 1), torch.arange(1, n)])
            ring = torch.tensor([[0], [n // 2]])  # one ring closure, so hop counts are not those of a path
            edge_index = torch.cat([chain, ring], 1)
            edge_index = torch.cat([edge_index, edge_index.flip(0)], 1)
            # Each feature an id of OGB's table for its column, as the model embeds them.
            atoms = [torch.randint(0, size, (n,), generator=gen) for size in OGB_ATOM_DIMS]
            bonds = [torch.randint(0, size, (edge_index.size(1),), generator=gen) for size in OGB_BOND_DIMS]
            molecules.append((torch.stack(atoms, 1), torch.stack(bonds, 1), edge_index,
                              torch.randint(0, 2, (1, 10), generator=gen).float()))
        torch.save(molecules, raw / f"{split}.pt")
    return sizes


@pytest.mark.slow
@pytest.mark.parametrize("virtual_node", [False, True])
def test_cli_explains_every_graph_of_a_graph_level_split(tmp_path, capsys, monkeypatch, virtual_node):
    monkeypatch.chdir(Path(__file__).parents[2])
    sizes = _peptide_copy(tmp_path / "lrgb")
    run = tmp_path / "run"
    code = main([
        "train", "--no-progress", "--config", "configs/peptides_func.yaml",
        *("--set", f"data.options.root={tmp_path / 'lrgb'}", "--set", f"out_dir={run}"),
        *("--set", "model.num_layers=2", "--set", "model.channels=16", "--set", "model.attention.k=3"),
        *("--set", "optim.epochs=1", "--set", "optim.warmup_epochs=0", "--set", "data.batch_size=2"),
        *("--set", "threads=1", "--set", "device=cpu"),
        *("--set", f"data.virtual_node={str(virtual_node).lower()}"),
    ])
    assert code == 0
    capsys.readouterr()
    code, printed = _explain_cli(capsys, run, "--graph", "all", "--split", "test")
    assert code == 0, printed.err
    result = json.loads((run / "explain" / "explain.json").read_text())
    assert result["graph"] == "all" and result["k"] == 3
    assert result["num_graphs"] == 5 and result["num_queries"] == result["num_nodes"] == sum(sizes["test"])
    explained = [(e["layer"], e["head"]) for e in result["layers"]]
    assert explained == [(layer, h) for layer in (0, 1) for h in range(4)]
    for entry in result["layers"]:
        assert entry["queries"] == [] and entry["stats"]["queries"] == sum(sizes["test"])
        assert sum(entry["stats"]["hops_histogram"].values()) == pytest.approx(1.0)
    assert result["uniform_reference"]["hops_histogram"][">64"] == 0.0
    on_hub = [e["stats"]["weight_on_virtual_node"] for e in result["layers"]]
    assert all(0 <= w <= 1 for w in on_hub) if virtual_node else on_hub == [None] * 8
    assert (run / "explain" / "explain_stats.png").stat().st_size > 1000
    assert not list((run / "explain").glob("explain_layer*.png"))
    table = printed.out.splitlines()
    assert table[0].startswith(f"{sum(sizes['test'])} queries in 5 graphs of split 'test', k = 3")
    assert "weight beyond 2 hops" in table[1]
    assert ("weight on the virtual node" in table[1]) == virtual_node
    rows = [line.split(" | ")[0] for line in table[3:7]]
    assert rows == ["| layer 0", "| layer 1", "| uniform keys", "| MPNN 1-hop"]
    # One molecule: the sampled queries are its atoms, never its virtual node.
    code, printed = _explain_cli(capsys, run, "--graph", "2", "--split", "test", "--sample", "100")
    assert code == 0, printed.err
    single = json.loads((run / "explain" / "explain.json").read_text())
    assert single["num_queries"] == sizes["test"][2]
    assert len(single["layers"][0]["queries"]) == sizes["test"][2]
