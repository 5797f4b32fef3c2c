"""Airflow DAG: Hourly XGBoost scoring; the pipeline lives in pipelines/tabular_scoring_hourly.yaml."""

from shardline.airflow.dag_factory import dag_from_spec

dag = dag_from_spec(__file__, "tabular_scoring_hourly.yaml")
