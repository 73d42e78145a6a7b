"""Datasets that need no network: road networks with City-Networks labels, local benchmark copies, PEs.

:func:`list_datasets` names the datasets that configs, ``kmipgt data`` and :func:`load_dataset` know.

The public names, listed in ``__init__.pyi``, are imported on first use (:func:`kmipgt.lazy.lazy_package`), so
that the registry (:mod:`kmipgt.data.registry`) loads without torch: a config's ``data.name`` is checked
before torch is imported.
"""

from kmipgt.lazy import lazy_package

lazy_package(__name__, __file__)
