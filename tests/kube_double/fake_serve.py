"""A stand-in for ``vllm serve`` for the double's own fast test (tests/test_kube_double.py): after a second and a
half it answers /v1/models with the served name and every POST with one token; no model is loaded."""
import json, sys, time
from http.server import BaseHTTPRequestHandler, HTTPServer
args = sys.argv[1:]
name = args[args.index("--served-model-name") + 1]; port = int(args[args.index("--port") + 1])
time.sleep(1.5)
class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def _send(self, body):
        data = json.dumps(body).encode(); self.send_response(200); self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data))); self.end_headers(); self.wfile.write(data)
    def do_GET(self): self._send({"data": [{"id": name}]})
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0))); self._send({"choices": [{"text": "x"}]})
print("Application startup complete.", flush=True)
HTTPServer(("127.0.0.1", port), H).serve_forever()
