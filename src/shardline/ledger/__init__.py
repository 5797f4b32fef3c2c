"""Shardline's job-metadata ledger: one DynamoDB table, shared by the worker and Airflow.

This package is the single source of truth for the table's schema, its key layout and
its states. It imports neither Airflow nor the worker, so both sides can depend on it.
Import each name from its module (``ledger.states``, ``ledger.keys``, ``ledger.table``...): the package itself
loads nothing, so importing the states or keys never loads pynamodb.
"""
