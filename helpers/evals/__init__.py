"""Judging a configuration: the agent loop and its tools, the agent recorded as sessions, versioned eval suites,
tool-call accuracy, and the scorecard row that puts speed, quality and memory side by side. Imports every floor
below (core, hardware, engine, measure, planning) and ``helpers.tiny``.
"""
