"""The torch-free name lists a config is checked against are the names the modules act on."""

from kmipgt.nn.choices import ATTENTION_ORDERS, NORM_POSITIONS
from kmipgt.nn.gps_layer import COMBINERS, NORM_PLACEMENTS
from kmipgt.train.choices import MODEL_KINDS
from kmipgt.train.models import MODEL_BUILDERS


def test_norm_positions_and_attention_orders_are_the_gps_layers_strategies():
    assert tuple(NORM_PLACEMENTS) == NORM_POSITIONS
    assert tuple(COMBINERS) == ATTENTION_ORDERS


def test_model_kinds_are_those_the_builders_build():
    assert tuple(MODEL_BUILDERS) == MODEL_KINDS
