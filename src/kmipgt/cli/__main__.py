"""``python -m kmipgt.cli`` (what ``torchrun -m kmipgt.cli train ...`` runs), as ``python -m kmipgt``."""

from kmipgt.cli import main

raise SystemExit(main())
