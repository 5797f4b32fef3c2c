"""What the test and benchmark Airflow's SQLite connections are opened with (``[database]
sql_alchemy_connect_args``): wait up to a minute for the write lock, where SQLite's default gives up after 5 s
and a busy triggerer or scheduler then dies with "database is locked". A deployed Airflow runs on Postgres."""

SQLITE_CONNECT_ARGS = {"timeout": 60}
