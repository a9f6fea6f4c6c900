"""offsetlake in Airflow: the operator, the DAG factory and the trigger-form validation.

Imported by DAG files and task processes only; the library itself never imports Airflow.
"""
