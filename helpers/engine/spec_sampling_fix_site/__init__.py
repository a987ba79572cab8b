"""Not imported as a package: this folder goes on a vLLM server's ``PYTHONPATH`` when the speculative-sampling fix is
switched on (``helpers.engine.spec_sampling_fix``), so that its ``sitecustomize`` runs in every process of that server."""
