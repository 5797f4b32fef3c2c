"""The Airflow plugin: Shardline's on-call app in the API server, a link to it in Airflow's navigation, and the
deadline reference a spec's ``deadline`` uses and the timetable of a pipeline started on arrival (Airflow finds
custom references and timetables only through a plugin).

Registered through the ``airflow.plugins`` entry point of the installed ``shardline`` package
(the provider's info names it too). Every Airflow process loads plugins, tasks included, so the
FastAPI app is only built on its first request, in the API server.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from shardline.airflow.deadlines import PartitionDue
from shardline.airflow.timetables import ArrivalTimetable
from shardline.airflow.ui.root import airflow_root_path

URL_PREFIX = "/shardline"


class LazyOnCallApp:
    """An ASGI app that builds ``shardline.airflow.ui.api.create_app()`` on its first request."""

    def __init__(self) -> None:
        self._app = None

    async def __call__(self, scope, receive, send) -> None:
        if self._app is None:
            from shardline.airflow.ui.api import create_app

            self._app = create_app()
        await self._app(scope, receive, send)


class ShardlineUiPlugin(AirflowPlugin):
    name = "shardline_ui"
    deadline_references = [PartitionDue]
    timetables = [ArrivalTimetable]  # a pipeline started on arrival (trigger:) names its intervals with it
    fastapi_apps = [{"app": LazyOnCallApp(), "url_prefix": URL_PREFIX, "name": "Shardline on-call"}]
    external_views = [
        {
            "name": "Shardline",
            "href": f"{airflow_root_path()}{URL_PREFIX}/",
            "icon": f"{airflow_root_path()}{URL_PREFIX}/icon.svg",
            "url_route": "shardline",
            "destination": "nav",
            "nav_top_level": True,  # its own entry in the navigation rail, not under "Plugins"
        }
    ]
