"""What a run measures: the load generator and its workloads, per-request stream timing, the server's own metrics,
load-run tables, where a sweep stops scaling, an agent's recorded sessions replayed as load, the routing
comparison across replicas and a replica's failure under load. A measurement takes a running engine (or its URL);
it never connects or starts one. Imports ``helpers.core``, ``helpers.hardware`` and ``helpers.engine``.
"""
