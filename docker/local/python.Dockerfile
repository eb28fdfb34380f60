# A stand-in for python:3.11-slim-bookworm built from Debian's own packages (Debian 12 ships Python 3.11):
# `python` and `pip` on PATH as in the official image, installing into a venv at /usr/local/python
# (Debian's system Python refuses `pip install`, PEP 668). Built by scripts/local_base_images.sh.
ARG DEBIAN_IMAGE=rlp-local/debian:bookworm
FROM ${DEBIAN_IMAGE}
ENV LANG=C.UTF-8
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /usr/local/python \
    && ln -s /usr/local/python/bin/python /usr/local/bin/python \
    && ln -s /usr/local/python/bin/pip /usr/local/bin/pip
ENV PATH=/usr/local/python/bin:$PATH
CMD ["python3"]
