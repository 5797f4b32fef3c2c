"""What Airflow's providers manager learns about Shardline (the ``apache_airflow_provider`` entry point).

``airflow providers list`` then shows the package, and ``airflow providers triggers`` and the
UI's provider page list what it brings. Pure data: importing this module imports no Airflow.
"""

from __future__ import annotations

from shardline import __version__

INTEGRATION = "Shardline"


def get_provider_info() -> dict:
    """The provider's description, in the runtime shape of Airflow's ``provider_info.schema.json``."""
    return {
        "package-name": "shardline",
        "name": "Shardline",
        "description": "Batch ML inference at scale: sharded SageMaker Processing jobs (or a local emulator), "
        "a job-metadata ledger in DynamoDB, and the operators, triggers and on-call page that "
        "drive them.",
        "versions": [__version__],
        "integrations": [{"integration-name": INTEGRATION, "tags": ["aws", "ml"]}],
        # The step's watch is a deferrable operator (its trigger polls), so provider_info lists it with the operators.
        "operators": [
            {
                "integration-name": INTEGRATION,
                "python-modules": [
                    "shardline.airflow.operators.plan",
                    "shardline.airflow.operators.step",
                    "shardline.airflow.operators.report",
                ],
            }
        ],
        "triggers": [{"integration-name": INTEGRATION, "python-modules": ["shardline.airflow.triggers.step"]}],
        # Jobs reach AWS through the Amazon provider's `aws` connection (spec: sagemaker.aws_conn_id);
        # Shardline defines no connection type of its own.
        "plugins": [{"name": "shardline_ui", "plugin-class": "shardline.airflow.ui.plugin.ShardlineUiPlugin"}],
    }
