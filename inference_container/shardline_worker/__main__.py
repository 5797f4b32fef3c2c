from shardline_worker.cli import main

# The guard matters: spawned pool workers import this module as __mp_main__.
if __name__ == "__main__":
    raise SystemExit(main())
