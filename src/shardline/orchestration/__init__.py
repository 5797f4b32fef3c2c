"""The step functions the Airflow tasks, the CLI and the page call: plan, submit, watch, resubmit, report.

``steps`` does the IO and applies ``shardline.decision``; ``services`` builds the clients a pipeline uses.
"""
