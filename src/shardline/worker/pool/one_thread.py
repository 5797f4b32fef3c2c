"""Imported first by the CPU pool's forkserver (``forkserver.PRELOAD_MODULES``): one thread for every native pool.

numpy, imported by the next preload module, loads OpenBLAS, which starts a thread per core at once, and each
spins for a while before it sleeps. In the forkserver those threads serve no one (a worker sets its own count),
and their spinning took a core from the main process's start-up: about 5% of a 1.6M-row job's wall time on 2
cores. Capped here, before numpy reads the setting, OpenBLAS starts none.
"""

import os

from shardline.worker.pool.devices import thread_cap_env

os.environ.update(thread_cap_env(1))
