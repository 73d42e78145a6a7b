"""``python -m kmipgt``."""

from kmipgt.cli import main

main()
