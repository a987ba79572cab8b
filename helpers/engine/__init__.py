"""The engine behind one interface (``interface.Engine``): a local vLLM process, several behind vLLM's router,
a Kubernetes Deployment, an endpoint run elsewhere; ``session.connect`` picks one from the settings, and
``session.thinking_model_served`` serves a lesson's thinking model for a block. Imports
``helpers.core``, ``helpers.hardware`` and ``helpers.cluster`` (its kubectl runner).
"""
