"""The process pool: files over every core and GPU, surviving a worker's crash.

- :mod:`.runner`: the pool. It feeds work units to worker processes, drives the scheduler, and keeps each file's
  result.
- :mod:`.scheduler`: the pure queue/suspect/poison state machine: which task runs next, and what a crash means.
- :mod:`.process`: what runs in each pool process: one work unit from its input to its output.
- :mod:`.devices`: how many worker processes to start, which device each owns, and their threads.
- :mod:`.forkserver`: the CPU pool's forkserver, started early, which preloads the model's library and the model.
- :mod:`.preload`: what that forkserver loads once before it forks the workers; :mod:`.preload_now` makes it load,
  and :mod:`.one_thread`, imported first, keeps every native thread pool there to one thread.
"""
