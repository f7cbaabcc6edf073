"""Request scenarios, after MLPerf LoadGen, but timing what LoadGen leaves out.

``run.scenario``:

- ``offline`` (default): every root row in chunks, throughput (``flows/benchmark.py``).
- ``single_stream``: one request at a time, each for ``run.request.roots`` validation keys,
  through retrieve (by key) -> preprocess -> tensorize -> compute -> calibrate -> write.
- ``server``: open-loop Poisson arrivals at ``run.request.target_qps``, generated up front
  from the seed; requests queue while the server is busy and may be batched together
  (``max_batch``, ``max_wait_ms``); latency runs from the scheduled arrival, so queueing
  counts.

Modules: ``schedule`` (arrivals and keys, from the seed), ``request`` (the timed six-step
path of one request), ``single_stream`` and ``server`` (the drivers), ``latency`` (the
record, ``latency.*`` metric keys and the LoadGen-style validity rules).
"""
