"""``python -m kmipgt``: the command-line interface."""

import sys

from kmipgt.cli import main

sys.exit(main())
