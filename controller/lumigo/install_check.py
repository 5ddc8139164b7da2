"""`lumigo-operator check`, the chart's `helm test`: do the two things users' pods depend on answer?

- The webhook, as the API server reaches it: a server-side dry-run create of a Lumigo in the
  release's namespace goes through the defaulter (same server, Service and certificate as the
  injector), so it proves the Service routes, the TLS serving pair matches the caBundle, and
  the server answers (`defaulter_probe`).
- The telemetry proxy, as an instrumented pod reaches it: an OTLP/HTTP export with no token must
  be refused with 401. A 2xx would mean it takes spans from anyone (a tenant-isolation failure);
  no answer means apps' spans are lost.
"""

from __future__ import annotations

import logging
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger("lumigo.check")

UNAUTHENTICATED = 401


@dataclass
class Report:
    passed: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


def proxy_refuses_the_unauthenticated(url: str, timeout: float) -> str:
    """POST an empty trace export without credentials until the proxy answers; what it did.
    Raises ValueError if it accepted it, TimeoutError if it never answered."""
    endpoint = url.rstrip("/") + "/v1/traces"
    started = time.monotonic()
    while True:
        request = urllib.request.Request(  # noqa: S310 - the URL is the chart's own Service
            endpoint, data=b"{}", method="POST", headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
                raise ValueError(
                    f"the telemetry proxy at {endpoint} accepted an export without a token "
                    f"(HTTP {response.status}): it must refuse it with {UNAUTHENTICATED}"
                )
        except urllib.error.HTTPError as err:
            if err.code == UNAUTHENTICATED:
                return f"the telemetry proxy at {endpoint} refuses an export without a token"
            problem = f"HTTP {err.code}"
        except (urllib.error.URLError, OSError) as err:
            problem = str(getattr(err, "reason", err))
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"the telemetry proxy at {endpoint} did not answer: {problem}")
        log.info("telemetry proxy not answering yet", extra={"error": problem})
        time.sleep(1.0)


def run(checks: dict[str, Callable[[], str]]) -> Report:
    """Run every check (one failing does not hide the others)."""
    report = Report()
    for name, check in checks.items():
        try:
            report.passed.append(check())
        except (OSError, ValueError, TimeoutError) as err:
            report.failed.append(f"{name}: {err}")
    return report
