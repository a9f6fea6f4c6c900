"""The offsetlake Airflow plugin: the only file in plugins/.

Airflow's plugin manager imports every .py file under plugins/ as a top-level
module in every Airflow process, so the library lives in src/offsetlake/ (an
installed package) and this folder holds nothing but the AirflowPlugin. The
offsetlake view in the Airflow UI will be registered here.
"""
from airflow.plugins_manager import AirflowPlugin


class OffsetlakePlugin(AirflowPlugin):
    name = "offsetlake"
