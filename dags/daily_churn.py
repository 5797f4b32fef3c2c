"""Airflow DAG: Daily two-step churn scoring; the pipeline lives in pipelines/daily_churn.yaml."""

from shardline.airflow.dag_factory import dag_from_spec

dag = dag_from_spec(__file__, "daily_churn.yaml")
