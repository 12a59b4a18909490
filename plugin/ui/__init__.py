"""The Branchwater view in Airflow's UI: an Airflow plugin whose FastAPI app the API server
serves under `/branchwater`, linked from the UI's navigation.

`paths` (where the view lives) imports nothing heavy; `app` holds the pages; `plugin` the
`AirflowPlugin` that the `airflow.plugins` entry point names.
"""
