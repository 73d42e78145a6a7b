# The public names of kmipgt.data, listed once. Type checkers read these imports as its re-exports
# (hence `as name`); at run time kmipgt.lazy.lazy_package reads them as __all__ and as the submodule
# each name is imported from on first use.

from .city_labels import eccentricity_labels as eccentricity_labels
from .city_labels import partition_labels as partition_labels
from .city_labels import road_adjacency as road_adjacency
from .city_networks import CityNetworks as CityNetworks
from .city_networks import load_city_network as load_city_network
from .graph_file import load_graph as load_graph
from .helsinki import HELSINKI_FEATURES as HELSINKI_FEATURES
from .helsinki import helsinki as helsinki
from .lrgb import lrgb_dataset as lrgb_dataset
from .lrgb import lrgb_splits as lrgb_splits
from .minnesota import MINNESOTA_FEATURES as MINNESOTA_FEATURES
from .minnesota import minnesota as minnesota
from .ogb_datasets import ogb_dataset as ogb_dataset
from .ogb_datasets import ogb_evaluator_metric as ogb_evaluator_metric
from .point_cloud import digits_knn as digits_knn
from .point_cloud import knn_graph as knn_graph
from .point_cloud import knn_graph_dataset as knn_graph_dataset
from .positional_encodings import LaplacianPE as LaplacianPE
from .positional_encodings import RandomWalkSE as RandomWalkSE
from .pyg_datasets import pyg_dataset as pyg_dataset
from .registry import DATASETS as DATASETS
from .registry import CategoricalFeatures as CategoricalFeatures
from .registry import Dataset as Dataset
from .registry import get_dataset as get_dataset
from .registry import list_datasets as list_datasets
from .registry import load_dataset as load_dataset
from .registry import register_dataset as register_dataset
from .road_graph import add_city_labels as add_city_labels
from .road_graph import haversine_metres as haversine_metres
from .road_graph import road_network_data as road_network_data
from .road_graph import symmetric_edges as symmetric_edges
from .splits import index_to_mask as index_to_mask
from .splits import random_split_masks as random_split_masks
from .splits import redraw_split_masks as redraw_split_masks
from .synthetic_city import SYNTHETIC_CITY_FEATURES as SYNTHETIC_CITY_FEATURES
from .synthetic_city import synthetic_city as synthetic_city
from .synthetic_parts import SYNTHETIC_PART_CATEGORIES as SYNTHETIC_PART_CATEGORIES
from .synthetic_parts import synthetic_parts as synthetic_parts
from .synthetic_rooms import synthetic_rooms as synthetic_rooms
from .user_files import load_file as load_file
from .virtual_node import add_virtual_node as add_virtual_node
from .virtual_node import virtual_node_mask as virtual_node_mask
