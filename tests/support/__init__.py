"""What the tests share: the worker runner and its checks, staged pipelines, the Airflow stack, fault injection."""
