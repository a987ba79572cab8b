"""Beside the floors: per-participant Kubernetes namespaces (render, apply, status, cards, teardown) and the
kubectl runner. Imports ``helpers.core``, ``helpers.hardware`` and ``helpers.planning`` only.
"""
