# A stand-in for postgres:16 from Debian's PostgreSQL 15 with what compose uses of the official image:
# POSTGRES_USER, POSTGRES_PASSWORD and POSTGRES_DB create the cluster on first start, the data
# directory /var/lib/postgresql/data is a volume, `pg_isready -U <user>` answers the health check,
# password (scram-sha-256) logins over the network. Built by scripts/local_base_images.sh.
ARG DEBIAN_IMAGE=rlp-local/debian:bookworm
FROM ${DEBIAN_IMAGE}
# No cluster from the package's postinst: the entrypoint makes one in the volume.
RUN mkdir -p /etc/postgresql-common/createcluster.d \
    && echo 'create_main_cluster = false' > /etc/postgresql-common/createcluster.d/no-main.conf \
    && apt-get update \
    && apt-get install -y --no-install-recommends postgresql-15 \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /var/lib/postgresql/data /run/postgresql \
    && chown -R postgres:postgres /var/lib/postgresql /run/postgresql
ENV PATH=/usr/lib/postgresql/15/bin:$PATH PGDATA=/var/lib/postgresql/data LANG=C.UTF-8
COPY postgres-entrypoint.sh /usr/local/bin/docker-entrypoint.sh
VOLUME /var/lib/postgresql/data
EXPOSE 5432
# Fast shutdown, as the official image.
STOPSIGNAL SIGINT
ENTRYPOINT ["docker-entrypoint.sh"]
CMD ["postgres"]
