"""``python -m duetime``: the same command as the ``duetime`` console script."""

from duetime.cli import main

raise SystemExit(main())
