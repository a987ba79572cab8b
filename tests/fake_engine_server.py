"""A stand-in for vLLM's API server process, for tests of ``LocalEngine`` without vLLM.

``python -m fake_engine_server --model M --served-model-name N ... --port P`` (the command line ``LocalEngine``
gives vLLM; other flags are ignored) answers ``GET /v1/models`` with N and ``POST /v1/completions`` with one
token, which is what the engine's readiness check asks for; anything else is 404. ``use_fake_engine``
makes the local engines a test starts run it.
"""

from __future__ import annotations

import argparse
import json
import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


def use_fake_engine(monkeypatch: Any) -> None:
    """Local engines started in this test run this module instead of vLLM (``monkeypatch``: pytest's fixture)."""
    from helpers.engine import local as local_engine

    monkeypatch.setattr(local_engine, "SERVER_MODULE", "fake_engine_server")
    here = str(Path(__file__).resolve().parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")])))


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False)
    parser.add_argument("--model", required=True)
    parser.add_argument("--served-model-name")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args, _ = parser.parse_known_args()
    served = args.served_model_name or args.model

    class Handler(BaseHTTPRequestHandler):
        def _answer(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802
            if self.path == "/v1/models":
                self._answer(200, {"object": "list", "data": [{"id": served, "object": "model"}]})
            else:
                self._answer(404, {"error": {"message": f"no {self.path} here"}})

        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.path == "/v1/completions":
                self._answer(200, {"choices": [{"text": "x", "index": 0, "finish_reason": "length"}]})
            else:
                self._answer(404, {"error": {"message": f"no {self.path} here"}})

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer((args.host, args.port), Handler)
    print(f"fake engine serving {served!r} ({args.model}) on port {args.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
