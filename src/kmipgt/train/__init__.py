"""Training, evaluation and predictions: configs, metrics, the training loop with exact resume, run reports.

The public names, listed in ``__init__.pyi``, are imported on first use (:func:`kmipgt.lazy.lazy_package`), so
reading and checking a config (:mod:`kmipgt.train.config`) does not import torch or PyG: ``kmipgt train``
reports a bad key at once.
"""

from kmipgt.lazy import lazy_package

lazy_package(__name__, __file__)
