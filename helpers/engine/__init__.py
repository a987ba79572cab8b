"""The engine behind one interface (``interface.Engine``): a local vLLM process, several behind vLLM's router,
a Kubernetes Deployment, an endpoint run elsewhere; ``session.connect`` picks one from the settings. Imports
``helpers.core``, ``helpers.hardware`` and ``helpers.cluster`` (its kubectl runner).
"""
