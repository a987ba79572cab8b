"""The ground floor: the environment contract, engine arguments, noise-aware comparisons, conclusions and the
lesson scaffolding, progress and tables. Pure: imports no other floor of ``helpers``, starts no engine and
reaches no network.
"""
