"""The input and output widths a model's saved weights were built for, read from the weights alone.

A checkpoint holds weights, not the widths of the data they were trained on (node features, edge features,
outputs). Predicting on new data needs them without the run's own data: to check that the new data fit,
and to build the model whose output has as many classes as training saw, whatever labels (if any) the
new data carry. Each width is found by building the config's model for widths one apart and reading,
in the saved weights, the dimension that followed it.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from kmipgt.data.registry import CategoricalFeatures
from kmipgt.train.categories import model_categories
from kmipgt.train.config import Config
from kmipgt.train.datasets import PreparedData
from kmipgt.train.models import MODEL_BUILDERS

__all__ = ["WIDTHS", "trained_widths"]

WIDTHS = ("in_channels", "edge_channels", "out_channels")  # the fields of PreparedData the model reads
PROBE = 5  # any width >= 1 does: only the change from PROBE to PROBE + 1 is read


def _weight_shapes(
    config: Config, level: str, widths: Mapping[str, int], categories: CategoricalFeatures
) -> dict[str, torch.Size]:
    # The builders themselves: build_model would log its note on ignored model keys for every probe.
    data = PreparedData(level, None, None, name="", node_categories=categories.node,
                        edge_categories=categories.edge, **widths)
    model = MODEL_BUILDERS[config.model.kind](config, data)
    return {key: value.shape for key, value in model.state_dict().items()}


def _saved_width(reference: dict[str, torch.Size], moved: dict[str, torch.Size],
                 weights: Mapping[str, torch.Tensor]) -> int | None:
    """The saved size of the first weight dimension that grew by one from ``reference`` to ``moved``
    (less its offset from the width); 0 where the saved weights lack that weight, None where none grew."""
    for key, shape in moved.items():
        before = reference[key]
        if before == shape:
            continue
        if key not in weights:  # e.g. an edge encoder of features, where the run had none: a learned vector
            return 0
        dim = next(d for d, (old, new) in enumerate(zip(before, shape)) if old != new)
        if weights[key].dim() != len(shape):
            raise ValueError(f"the saved weight {key} has shape {list(weights[key].shape)}, which this "
                             f"config's model cannot have (its shape: {list(shape)} for these widths)")
        return weights[key].shape[dim] - (shape[dim] - (PROBE + 1))
    return None


def trained_widths(config: Config, level: str, weights: Mapping[str, torch.Tensor]) -> dict[str, int | None]:
    """``{"in_channels", "edge_channels", "out_channels"}``: the node features, edge features and outputs
    of the ``level`` model of ``config`` whose state dict is ``weights``; None for a width that no weight
    depends on (PyG baselines read no edge features), 0 for edge features the run did not have. Features
    of category ids are as many as the dataset has tables (:func:`~kmipgt.train.categories.model_categories`):
    a model embeds each column by its own table, so their count is not probed.

    ``config.model.kind`` must be a known kind (:func:`~kmipgt.train.validation.validate_config`).
    """
    categories = model_categories(config)
    tables = {name: len(sizes) for name, sizes in (("in_channels", categories.node),
                                                    ("edge_channels", categories.edge)) if sizes}
    probe = {**dict.fromkeys(WIDTHS, PROBE), **tables}
    reference = _weight_shapes(config, level, probe, categories)
    return {
        name: tables[name] if name in tables else _saved_width(
            reference, _weight_shapes(config, level, {**probe, name: PROBE + 1}, categories), weights
        )
        for name in WIDTHS
    }
