"""The offsetlake Airflow plugin: the only file in plugins/.

Airflow's plugin manager imports every .py file under plugins/ as a top-level
module in every Airflow process, so the library lives in src/offsetlake/ (an
installed package) and this folder holds nothing but the AirflowPlugin:

- a FastAPI app on the api-server at /offsetlake (`offsetlake.airflow.view`):
  the offsetlake page, its JSON, and Prometheus metrics at /offsetlake/metrics;
- two external views showing that page inside the Airflow UI: "offsetlake" in
  the navigation (every pipeline) and an "offsetlake" tab on each DAG (the
  DAG's pipeline).
"""

from airflow.plugins_manager import AirflowPlugin

from offsetlake.airflow.view import app


class OffsetlakePlugin(AirflowPlugin):
    name = "offsetlake"
    fastapi_apps = [{"app": app, "url_prefix": "/offsetlake", "name": "offsetlake"}]
    external_views = [
        {
            "name": "offsetlake",
            "href": "/offsetlake/",
            "destination": "nav",
            "url_route": "offsetlake",
            "category": "browse",
        },
        {
            "name": "offsetlake",
            "href": "/offsetlake/?dag_id={DAG_ID}",
            "destination": "dag",
            "url_route": "offsetlake-dag",
        },
    ]
