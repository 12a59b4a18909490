"""`make demo`: the main job — Airflow running the shipped DAGs on the embedded default.

Everything lives under one demo directory (`.branchwater/demo/` by default), made anew on each
run: the lake (SQLite KV + local files), Airflow's homes with SQLite metadata DBs, the task
logs and the GC reports. The DAGs run for real through `dag.test()`, each DAG run in its own
process and Airflow home, so that several ETL runs merge into `main` at the same time.
"""
