"""Random data shaped like a config's dataset, for timing its training step without the dataset.

``kmipgt bench step`` trains on these in place of data that needs a local copy or minutes to label:

- ``lrgb`` (Peptides-func, Peptides-struct): molecule-like graphs of 100-199 atoms, a backbone chain with
  short side branches and a ring closure per 40 atoms (about n + 3 bonds, as Peptides' 151 atoms and 154
  bonds on average), OGB's 9 integer atom and 3 bond features and the dataset's targets;
- ``city_networks`` and ``synthetic_city``: a synthetic city of the configured (or the real city's) number
  of nodes, its 37 features (12 with ``augmented: false``), with random labels of 10 classes and a
  10/10/80 split in place of the eccentricity labels, which do not change the cost of a step.
- ``s3dis``: blocks of 4,096 random points with S3DIS's 9 columns (xyz, rgb, room-normalised xyz), labels
  of its 13 classes and the configured kNN graph;
- ``shapenet_part``: shapes of 2,048 random points with ShapeNet-Part's 6 columns (normals, xyz), a
  category each and part labels among that category's parts, and the configured kNN graph.

Every other dataset needs neither a copy nor long preparation and is loaded as configured (None here).
"""

from __future__ import annotations

from typing import Any

import torch
from torch_geometric.data import Data

from kmipgt.data import random_split_masks, synthetic_city
from kmipgt.data.city_networks import CITY_NUM_NODES
from kmipgt.data.lrgb import OGB_ATOM_DIMS, OGB_BOND_DIMS
from kmipgt.data.point_cloud import knn_graph
from kmipgt.data.shapenet_part import shapenet_part_category_parts
from kmipgt.train.config import Config

__all__ = ["PEPTIDES_TARGETS", "molecule_like_graphs", "stand_in_data"]

# Peptides dataset -> (targets per graph, whether they are binary labels)
PEPTIDES_TARGETS = {"peptides-func": (10, True), "peptides-struct": (11, False)}
# Classes of the City-Networks labels (10 chunks of eccentricity); node features without the augmentation.
CITY_CLASSES = 10
CITY_PLAIN_FEATURES = 12
# Points per block and classes of S3DIS's blocks; points per shape of ShapeNet-Part's.
S3DIS_POINTS, S3DIS_CLASSES = 4096, 13
SHAPENET_POINTS = 2048


def _integer_features(rows: int, dims: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    return torch.stack([torch.randint(0, dim, (rows,), generator=generator) for dim in dims], dim=1)


def _molecule(num_atoms: int, targets: int, binary: bool, generator: torch.Generator) -> Data:
    """One molecule-like graph: atom i > 0 bonds to one of atoms i-3..i-1, plus a ring closure i -> i+5
    per 40 atoms; both directions of each bond."""
    atoms = torch.arange(1, num_atoms)
    back = torch.randint(1, 4, (num_atoms - 1,), generator=generator)
    parents = (atoms - back).clamp_min(0)
    rings = torch.randint(0, num_atoms - 5, (num_atoms // 40,), generator=generator)
    source = torch.cat([parents, rings])
    target = torch.cat([atoms, rings + 5])
    edge_index = torch.stack([torch.cat([source, target]), torch.cat([target, source])])
    bonds = _integer_features(source.numel(), OGB_BOND_DIMS, generator)
    y = torch.randint(0, 2, (1, targets), generator=generator).float() if binary else torch.randn(
        1, targets, generator=generator
    )
    return Data(x=_integer_features(num_atoms, OGB_ATOM_DIMS, generator), edge_index=edge_index,
                edge_attr=torch.cat([bonds, bonds]), y=y)


def molecule_like_graphs(
    name: str, sizes: dict[str, int], seed: int = 0, atoms: tuple[int, int] = (100, 199)
) -> dict[str, list[Data]]:
    """Random molecule-like graphs shaped like LRGB's ``name`` (``Peptides-func`` or ``Peptides-struct``),
    ``sizes[split]`` graphs per split, each of ``atoms[0]`` to ``atoms[1]`` atoms (inclusive).

    Each graph has ``x`` long ``[n, 9]``, ``edge_index [2, E]`` (both directions), ``edge_attr`` long
    ``[E, 3]`` and ``y`` ``[1, 10]`` binary labels (func) or ``[1, 11]`` floats (struct), as the
    dataset's graphs.
    """
    key = name.lower()
    if key not in PEPTIDES_TARGETS:
        raise ValueError(f"name must be Peptides-func or Peptides-struct, got {name!r}")
    low, high = atoms
    if not 6 <= low <= high:
        raise ValueError(f"atoms must be (low, high) with 6 <= low <= high, got {atoms}")
    targets, binary = PEPTIDES_TARGETS[key]
    generator = torch.Generator().manual_seed(seed)
    out = {}
    for split, count in sizes.items():
        counts = torch.randint(low, high + 1, (count,), generator=generator).tolist()
        out[split] = [_molecule(n, targets, binary, generator) for n in counts]
    return out


def _city(num_nodes: int, seed: int, num_edges: int | None) -> Data:
    graph = synthetic_city(num_nodes, seed, num_edges=num_edges, labels=False, progress=False)
    generator = torch.Generator().manual_seed(seed)
    graph.y = torch.randint(0, CITY_CLASSES, (num_nodes,), generator=generator)
    graph.train_mask, graph.val_mask, graph.test_mask = random_split_masks(num_nodes, 0.1, 0.1, seed)
    return graph


def _s3dis_block(k: int, generator: torch.Generator) -> Data:
    x = torch.rand(S3DIS_POINTS, 9, generator=generator)
    pos = x[:, :3].clone()
    y = torch.randint(0, S3DIS_CLASSES, (S3DIS_POINTS,), generator=generator)
    return Data(x=x, pos=pos, y=y, area=torch.tensor([1]), edge_index=knn_graph(pos, k))


def _shapenet_shape(k: int, generator: torch.Generator) -> Data:
    parts = shapenet_part_category_parts()
    category = int(torch.randint(0, len(parts), (1,), generator=generator))
    allowed = torch.tensor(parts[category])
    pos = torch.rand(SHAPENET_POINTS, 3, generator=generator)
    normals = torch.nn.functional.normalize(torch.randn(SHAPENET_POINTS, 3, generator=generator), dim=1)
    y = allowed[torch.randint(0, allowed.numel(), (SHAPENET_POINTS,), generator=generator)]
    return Data(x=torch.cat([normals, pos], 1), pos=pos, y=y, category=torch.tensor([category]),
                edge_index=knn_graph(pos, k))


_POINT_CLOUDS = {"s3dis": (_s3dis_block, 32), "shapenet_part": (_shapenet_shape, 8)}


def stand_in_data(config: Config, train_graphs: int) -> Any | None:
    """The raw dataset (as ``config.data.name``'s loader returns it) that stands in for ``config``'s, or
    None where the configured dataset itself is cheap to load. Graph-level stand-ins have
    ``train_graphs`` training graphs and one validation and one test graph."""
    options, seed = config.data.options, config.seed
    if config.data.name == "lrgb":
        sizes = {"train": train_graphs, "val": 1, "test": 1}
        return molecule_like_graphs(options.get("name", ""), sizes, seed)
    if config.data.name == "city_networks":
        name = str(options.get("name", "")).lower()
        if name not in CITY_NUM_NODES:
            raise ValueError(f"data.options.name must be one of {sorted(CITY_NUM_NODES)}, got {name!r}")
        graph = _city(CITY_NUM_NODES[name], seed, None)
        if not options.get("augmented", True):
            graph.x = graph.x[:, :CITY_PLAIN_FEATURES]
        return graph
    if config.data.name == "synthetic_city":
        return _city(options.get("num_nodes", 0), options.get("seed", seed), options.get("num_edges"))
    if config.data.name in _POINT_CLOUDS:
        make, default_k = _POINT_CLOUDS[config.data.name]
        generator = torch.Generator().manual_seed(seed)
        sizes = {"train": train_graphs, "val": 1, "test": 1}
        k = options.get("k", default_k)
        return {split: [make(k, generator) for _ in range(count)] for split, count in sizes.items()}
    return None
