"""Support code shared by the tests and the benchmarks, part of neither the product nor a test suite: a
private redis-server (``private_redis``), a local multi-node Ray cluster (``ray_cluster``) and the
pipeline's cost-model parts that stand in for GPU engines (``simulated``)."""
