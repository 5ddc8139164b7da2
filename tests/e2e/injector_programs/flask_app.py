"""A user's Flask application: knows nothing about Lumigo. Reports its environment."""

import os
import sys

from flask import Flask

app = Flask(__name__)


@app.get("/hello")
def hello() -> dict[str, object]:
    user_site = sys.modules.get("sitecustomize")
    try:
        import usermod  # only present when the test sets a user PYTHONPATH

        user_module = usermod.VALUE
    except ImportError:
        user_module = None
    return {
        "env": {k: os.environ.get(k) for k in ("PYTHONPATH", "LD_PRELOAD", "USER_PRELOAD_LOADED")},
        "user_sitecustomize": getattr(user_site, "USER_SITECUSTOMIZE", False),
        "user_module": user_module,
        "sys_path": sys.path,
    }


if __name__ == "__main__":
    app.run(host="127.0.0.1", port=int(os.environ["PORT"]))
