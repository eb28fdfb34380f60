# A stand-in for redis:7 from Debian's redis-server (7.0): listens on every interface without protected
# mode, data in the /data volume, `redis-cli ping` for the health check, runs as the redis user.
ARG DEBIAN_IMAGE=rlp-local/debian:bookworm
FROM ${DEBIAN_IMAGE}
RUN apt-get update \
    && apt-get install -y --no-install-recommends redis-server \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir /data && chown redis:redis /data
VOLUME /data
WORKDIR /data
USER redis
EXPOSE 6379
CMD ["redis-server", "--bind", "0.0.0.0", "::", "--protected-mode", "no", "--dir", "/data", "--daemonize", "no"]
