"""Grid sweeps: every combination of config overrides, each cell trained in its own ``kmipgt train``
process, then summarised.

:mod:`~kmipgt.sweep.spec` reads the sweep file and expands its cells, :mod:`~kmipgt.sweep.run` trains them,
:mod:`~kmipgt.sweep.stats` summarises the results rows and :mod:`~kmipgt.sweep.report` writes the CSV,
markdown and plot.
"""

from kmipgt.sweep.report import summary_markdown, write_reports
from kmipgt.sweep.run import cell_state, check_cells, run_cell, run_sweep
from kmipgt.sweep.spec import Cell, Sweep, cell_dir, cell_overrides, expand, format_value, load_sweep
from kmipgt.sweep.stats import paired_differences, summarize

__all__ = [
    "Cell",
    "Sweep",
    "cell_dir",
    "cell_overrides",
    "cell_state",
    "check_cells",
    "expand",
    "format_value",
    "load_sweep",
    "paired_differences",
    "run_cell",
    "run_sweep",
    "summarize",
    "summary_markdown",
    "write_reports",
]
