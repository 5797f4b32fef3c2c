"""The process pool: the pure ``scheduler`` (queue, suspects, poison), the ``runner`` that drives it, what runs
in each pool ``process``, the work units, the devices and threads, the forkserver that preloads the model, and
the guards on what a model library says while it predicts."""
