"""Beside the floors: the tiny models this kit ships, their chat format, the agent tools they are trained on,
the synthetic corpus, and the training script. Imports ``helpers.core`` only.
"""
