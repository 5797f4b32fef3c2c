"""The Airflow layer: the DAG factory, operators, triggers and the on-call page. Thin: policy lives below."""
