"""``python -m shardline``: the on-call CLI, as the ``shardline`` command runs it."""

from shardline.oncall.cli import main

raise SystemExit(main())
