"""Prometheus metrics of the controller runtime, named as client-go and controller-runtime do.

Dashboards and alerts written for Go operators work unchanged, so every name, label and bucket
here follows theirs (listed in docs/operations.md, "Metrics"). Metrics are defined once, at
import, on the default registry; this module is only a list of definitions, the code that moves
them lives with the thing it measures (e.g. `controller/runtime/workqueue.py`).
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, disable_created_metrics

# Go clients export no `*_created` series; keep the exposition identical.
disable_created_metrics()  # type: ignore[no-untyped-call]

# client-go's ExponentialBuckets(10e-9, 10, 12): 10 ns ... 1000 s.
WORKQUEUE_BUCKETS = (1e-8, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0, 1000.0)

# Both labels carry the queue name, as controller-runtime sets them (name=controller=<name>).
WORKQUEUE_LABELS = ("name", "controller")

WORKQUEUE_DEPTH = Gauge(
    "workqueue_depth",
    "Number of keys waiting in the work queue",
    WORKQUEUE_LABELS,
)
WORKQUEUE_ADDS = Counter(
    "workqueue_adds_total",
    "Keys added to the work queue (duplicates of waiting keys not counted)",
    WORKQUEUE_LABELS,
)
WORKQUEUE_QUEUE_DURATION = Histogram(
    "workqueue_queue_duration_seconds",
    "Seconds a key waits in the work queue between its first add and a worker taking it",
    WORKQUEUE_LABELS,
    buckets=WORKQUEUE_BUCKETS,
)
WORKQUEUE_WORK_DURATION = Histogram(
    "workqueue_work_duration_seconds",
    "Seconds a worker holds a key, from get to done",
    WORKQUEUE_LABELS,
    buckets=WORKQUEUE_BUCKETS,
)
WORKQUEUE_UNFINISHED_WORK = Gauge(
    "workqueue_unfinished_work_seconds",
    "Sum of the ages of keys being processed right now; a steady rise means stuck workers "
    "(its slope is their number)",
    WORKQUEUE_LABELS,
)
WORKQUEUE_LONGEST_RUNNING_PROCESSOR = Gauge(
    "workqueue_longest_running_processor_seconds",
    "Age in seconds of the oldest key being processed right now",
    WORKQUEUE_LABELS,
)
WORKQUEUE_RETRIES = Counter(
    "workqueue_retries_total",
    "Delayed or rate-limited re-adds to the work queue",
    WORKQUEUE_LABELS,
)


# --- client-go rest client ------------------------------------------------------------------
REST_REQUESTS = Counter(
    "rest_client_requests_total",
    "Number of HTTP requests, partitioned by status code, method, and host.",
    ["code", "method", "host"],
)
REST_LATENCY = Histogram(
    "rest_client_request_duration_seconds",
    "Request latency in seconds. Broken down by verb, and host.",
    ["verb", "host"],
    buckets=(0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0),
)

# --- controller-runtime controllers ------------------------------------------------------------
RECONCILE_TOTAL = Counter(
    "controller_runtime_reconcile_total",
    "Total number of reconciliations per controller",
    ["controller", "result"],
)
RECONCILE_ERRORS = Counter(
    "controller_runtime_reconcile_errors_total",
    "Total number of reconciliation errors per controller",
    ["controller"],
)
TERMINAL_ERRORS = Counter(
    "controller_runtime_terminal_reconcile_errors_total",
    "Total number of terminal reconciliation errors per controller",
    ["controller"],
)
RECONCILE_PANICS = Counter(
    "controller_runtime_reconcile_panics_total",
    "Total number of reconciliation panics per controller",
    ["controller"],
)
RECONCILE_TIME = Histogram(
    "controller_runtime_reconcile_time_seconds",
    "Length of time per reconciliation per controller",
    ["controller"],
    buckets=(
        0.005,
        0.01,
        0.025,
        0.05,
        0.1,
        0.15,
        0.2,
        0.25,
        0.3,
        0.35,
        0.4,
        0.45,
        0.5,
        0.6,
        0.7,
        0.8,
        0.9,
        1.0,
        1.25,
        1.5,
        1.75,
        2.0,
        2.5,
        3.0,
        3.5,
        4.0,
        4.5,
        5,
        6,
        7,
        8,
        9,
        10,
        15,
        20,
        25,
        30,
        40,
        50,
        60,
    ),
)
MAX_CONCURRENT = Gauge(
    "controller_runtime_max_concurrent_reconciles",
    "Maximum number of concurrent reconciles per controller",
    ["controller"],
)
ACTIVE_WORKERS = Gauge(
    "controller_runtime_active_workers",
    "Number of currently used workers per controller",
    ["controller"],
)

# --- leader election ------------------------------------------------------------------------------
LEADER_STATUS = Gauge(
    "leader_election_master_status",
    "Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, "
    "1 indicates master. 'name' is the string used to identify the lease.",
    ["name"],
)
