"""What differs between task levels, so the training loop never asks which level it trains.

One class per ``task.level``, each on :class:`~kmipgt.train.tasks.base.Task`'s defaults: ``node``
(:mod:`~kmipgt.train.tasks.node`: one graph, split masks, full batch), ``graph``
(:mod:`~kmipgt.train.tasks.graph`: mini-batches of many graphs), ``node`` over a set of graphs
(:mod:`~kmipgt.train.tasks.node_batch`: mini-batches, a label per node) and ``edge``
(:mod:`~kmipgt.train.tasks.link`: scored node pairs on one graph, fresh negatives every epoch);
:mod:`~kmipgt.train.tasks.levels` picks the class of a run's data. Each says which graphs a training epoch
steps through, which nodes the loss sees, the targets, how each split is scored (on its outputs at once, or
batch by batch) and which graph a split lives on.

This package imports nothing itself: importing one of its modules pulls in only what that module needs.
"""
