from kmipgt.cli import main

raise SystemExit(main())
