"""Arithmetic before anything runs: a model's shape and memory plan from its config.json, the KV cache,
rooflines, token prices and costs (and what a real step pays beyond the roofline), quantization formats, KV reuse, speculative decoding's expected
acceptance, a model on a share of a GPU (MIG slice, time-slicing) and the day's cost.
Pure: imports ``helpers.core`` and ``helpers.hardware`` only, and reaches no engine or network.
"""
