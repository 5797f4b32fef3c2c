"""On call: the service behind the `shardline` CLI and the page, the CLI itself, and Airflow's REST client."""
