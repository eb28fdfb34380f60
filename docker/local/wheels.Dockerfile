# Local wheels (e.g. torch's CPU build when its index is out of reach) as an image that docker/Dockerfile
# bind-mounts read-only during `pip install` (WHEELS_IMAGE): nothing of it ends up in a layer.
FROM scratch
COPY . /
