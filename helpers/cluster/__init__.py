"""Beside the floors: per-participant Kubernetes namespaces (render, apply, status, cards, teardown, the dress
rehearsal), the room's one model download and the fences around each namespace (room), and the kubectl runner.
Imports ``helpers.core``, ``helpers.hardware`` and ``helpers.planning`` only.
"""
