"""Tiny trained runs for the tests of commands that read a run directory (explain, bench approx)."""

from kmipgt.cli import main


def train_tiny_city(out, attention: str = "kmip", num_nodes: int = 600) -> None:
    """Two epochs of a 2-layer, 16-channel GPS model on a small synthetic city, written to ``out``."""
    code = main([
        "train", "--no-progress", "--config", "configs/synthetic_city.yaml",
        *("--set", f"out_dir={out}", "--set", f"data.options={{num_nodes: {num_nodes}, seed: 0}}"),
        *("--set", "model.num_layers=2", "--set", "model.channels=16", "--set", "threads=1"),
        *("--set", f"model.attention={attention}", "--set", "optim.epochs=2"),
        *("--set", "optim.warmup_epochs=1", "--set", "device=cpu"),
    ])
    assert code == 0
