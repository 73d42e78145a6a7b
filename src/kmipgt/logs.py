"""What kmipgt tells the user while it works: the ``kmipgt`` logger, set up once by the command line.

Modules log to ``logging.getLogger(__name__)`` (children of ``kmipgt``). A library user sees warnings
through Python's default handling; :func:`configure_logging` (the CLI's ``--quiet`` / ``--verbose``) picks
how much is shown: ``WARNING`` also hides training progress bars, ``INFO`` is the default, ``DEBUG`` adds
a line per training epoch.
"""

from __future__ import annotations

import logging
import sys

from tqdm import tqdm

__all__ = ["LOGGER_NAME", "configure_logging", "quiet"]

LOGGER_NAME = "kmipgt"


class _StderrHandler(logging.Handler):
    """Plain message lines on stderr, written past any running progress bar.

    ``sys.stderr`` is looked up per record rather than stored, so a swapped stream (pytest's ``capsys``, a
    caller's redirect) still gets the lines; ``tqdm.write`` clears and redraws an active bar around them.
    """

    def emit(self, record: logging.LogRecord) -> None:
        try:
            tqdm.write(self.format(record), file=sys.stderr)
        except Exception:
            self.handleError(record)


def configure_logging(level: int | str = logging.INFO) -> None:
    """Show ``kmipgt`` log records of ``level`` and above on stderr, one plain line each.

    Safe to call again (one handler; the level is replaced). Records still propagate to the root logger,
    so an application's own handlers (or pytest's ``caplog``) see them too.
    """
    logger = logging.getLogger(LOGGER_NAME)
    logger.setLevel(level)
    if not any(isinstance(handler, _StderrHandler) for handler in logger.handlers):
        logger.addHandler(_StderrHandler())


def quiet() -> bool:
    """True when the ``kmipgt`` logger was set above INFO (``--quiet``): progress bars stay hidden too.

    An unset level (a library user who configured nothing) is not quiet, so bars show as they always did.
    """
    level = logging.getLogger(LOGGER_NAME).level
    return level != logging.NOTSET and level > logging.INFO
