"""The Python test application (Flask): knows nothing about Lumigo.

Every test app image answers the same three paths on $PORT (default 8080), so node tests can
drive a Python, a Node.js, a JVM and a musl app alike:
  GET /healthz        200 "ok" (probes)
  GET /               JSON: app, runtime, whether a tracer is loaded, and the environment
                      variables an injection touches (a token is only reported as set/unset)
  GET /call?url=URL   makes an outgoing GET to URL (a client span; Service-name checks)
"""

import os
import signal
import sys
import urllib.request

from flask import Flask, jsonify, request

ENV_KEYS = ("LD_PRELOAD", "PYTHONPATH", "NODE_OPTIONS", "JAVA_TOOL_OPTIONS", "OTEL_SERVICE_NAME")

app = Flask(__name__)


@app.get("/healthz")
def healthz() -> str:
    return "ok\n"


@app.get("/")
def describe() -> object:
    return jsonify(
        app="python-flask",
        runtime=f"python {sys.version.split()[0]}",
        traced=any(name.startswith("lumigo_opentelemetry") for name in sys.modules),
        env={key: os.environ.get(key) for key in ENV_KEYS},
        token_set="LUMIGO_TRACER_TOKEN" in os.environ,
    )


@app.get("/call")
def call() -> object:
    url = request.args["url"]
    with urllib.request.urlopen(url, timeout=10) as response:
        return jsonify(url=url, status=response.status, body=response.read(200).decode())


if __name__ == "__main__":
    # PID 1 in a container: without a handler SIGTERM is ignored and a pod takes its whole
    # grace period to stop.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    app.run(host="0.0.0.0", port=int(os.environ.get("PORT", "8080")))
