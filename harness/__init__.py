"""Support code shared by the tests and the benchmarks, part of neither the product nor a test suite: a
private redis-server (``private_redis``), a local multi-node Ray cluster (``ray_cluster``), a trainer
group in local processes without Ray (``trainer_group``: the group's equivalence tests, its benchmark
and the GPU check) and the pipeline's cost-model parts that stand in for GPU engines (``simulated``)."""
