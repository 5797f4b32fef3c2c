# Stand-in for postgres:16, for machines with no registry (make test-stack builds it only when that tag
# is missing and cannot be pulled): Debian bookworm's PostgreSQL 15, started as the official image starts,
# from POSTGRES_USER / POSTGRES_PASSWORD / POSTGRES_DB, with its data in /var/lib/postgresql/data.
FROM shardline-stack-base:bookworm
RUN apt-get update \
    && apt-get install -y --no-install-recommends postgresql-15 postgresql-client-15 \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /var/lib/postgresql/data /var/run/postgresql \
    && chown -R postgres:postgres /var/lib/postgresql /var/run/postgresql
ENV PATH=/usr/lib/postgresql/15/bin:$PATH \
    PGDATA=/var/lib/postgresql/data
COPY postgres-entrypoint.sh /entrypoint
USER postgres
EXPOSE 5432
ENTRYPOINT ["/entrypoint"]
