"""torch.distributed: query-sharded k-MIP attention, graph partitions with halo exchange, the bytes they
send, DDP glue.

Only torch.distributed collectives and PyTorch's launchers (``torchrun``); no transport of our own.
See ``docs/distributed.md``.

The public names, listed in ``__init__.pyi``, are imported on first use (:func:`kmipgt.lazy.lazy_package`), so
that :mod:`kmipgt.distributed.choices` loads without torch: a config's ``distributed`` section is checked
before torch is imported.
"""

from kmipgt.lazy import lazy_package

lazy_package(__name__, __file__)
