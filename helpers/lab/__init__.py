"""Beside the floors: the learner's copies of the notebooks and running notebooks headless. Imports
``helpers.core`` and ``helpers.engine`` only.
"""
