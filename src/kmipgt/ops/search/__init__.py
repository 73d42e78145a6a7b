"""Top-k inner-product search: a dispatcher, a registry and backends that register themselves.

- :mod:`~kmipgt.ops.search.dispatch`: ``topk_inner_product``, ``SEARCH_BACKENDS``, ``APPROXIMATE_BACKENDS``.
- :mod:`~kmipgt.ops.search.registry`: ``name -> SearchBackend`` (search function and capability flags).
- :mod:`~kmipgt.ops.search.backends`: one module per backend (``torch``/``dense``, ``fused``, ``triton``,
  ``keops``, ``ivf``, ``faiss``).
- Shared by backends, importing none: :mod:`~kmipgt.ops.search.checks` (input validation),
  :mod:`~kmipgt.ops.search.blockwise` (exact torch search, tie-break order), the kernels
  :mod:`~kmipgt.ops.search.fused_kernel` (C++, ``csrc/``) and :mod:`~kmipgt.ops.search.triton_kernel`, the
  Triton kernel's launch plans :mod:`~kmipgt.ops.search.triton_plan`, the CUDA device facts a launch needs
  :mod:`~kmipgt.ops.search.cuda_device` (shared memory, device guard), and
  :mod:`~kmipgt.ops.search.ivf_common` (what ``ivf`` and ``faiss`` share).

This package imports nothing itself, so importing one of its modules never pulls in the dispatcher.
"""
