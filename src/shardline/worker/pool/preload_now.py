"""Imported by the CPU pool's forkserver only (``forkserver.PRELOAD_MODULES``): load the model there.

Importing :mod:`shardline.worker.pool.preload` loads nothing, so the main process and spawned
workers can import it freely; the forkserver imports this module, once, before it forks a worker.
"""

from shardline.worker.pool import preload

preload.preloaded = preload.load_in_forkserver()
