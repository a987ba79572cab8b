"""Arithmetic before anything runs: a model's shape and memory plan from its config.json, the KV cache,
rooflines, token prices and costs, quantization formats, KV reuse, speculative decoding's expected
acceptance. Pure: imports ``helpers.core`` and ``helpers.hardware`` only, and reaches no engine or network.
"""
