import torch

from kmipgt.cli import main


def test_data_info_minnesota(capsys):
    assert main(["data", "info", "minnesota"]) == 0
    out = capsys.readouterr().out
    assert "nodes: 2642" in out and "directed_edges: 6608" in out and "train_mask: 264" in out


def test_data_synthetic_writes_loadable_graph(tmp_path, capsys):
    out_file = tmp_path / "city.pt"
    assert main(["data", "synthetic", "--num-nodes", "400", "--no-labels", "--out", str(out_file)]) == 0
    out = capsys.readouterr().out
    assert "nodes: 400" in out and "time generation:" in out and "time labels" not in out
    data = torch.load(out_file, weights_only=False)
    assert data.num_nodes == 400 and data.x.shape == (400, 37) and "y" not in data


def test_data_info_missing_copy_is_a_clear_error(tmp_path, capsys):
    assert main(["data", "info", "city_networks", "--root", str(tmp_path), "--set", "name=paris"]) == 2
    err = capsys.readouterr().err
    assert "No City-Networks copy" in err and "edge_indices.pt" in err


def test_data_synthetic_takes_an_edge_count(capsys):
    assert main(["data", "synthetic", "--num-nodes", "400", "--num-edges", "530", "--no-labels"]) == 0
    assert "directed_edges: 1060" in capsys.readouterr().out
