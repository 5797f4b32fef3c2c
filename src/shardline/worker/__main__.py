# The guard matters: spawned pool workers import this module as __mp_main__, and must
# neither run the job nor pay for the CLI's imports.
if __name__ == "__main__":
    from shardline.worker.job.cli import main

    raise SystemExit(main())
