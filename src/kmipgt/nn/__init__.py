"""Neural-network modules: global attention (one projection, a core per registered kind: k-MIP, full,
Performer, GRF), local MPNN kinds, GPS layers, PyG's GPSConv with k-MIP, the model, PyG baselines.

The public names, listed in ``__init__.pyi``, are imported on first use (:func:`kmipgt.lazy.lazy_package`), so
that the kind registries and :mod:`kmipgt.nn.choices` load without torch: a config's names are checked before
torch is imported.
"""

from kmipgt.lazy import lazy_package

lazy_package(__name__, __file__)
