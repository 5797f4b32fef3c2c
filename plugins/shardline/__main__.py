"""``python -m shardline``: the on-call CLI, as the ``shardline`` command runs it."""

from shardline.cli import main

raise SystemExit(main())
