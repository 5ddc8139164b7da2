"""Prometheus metrics of the controller runtime, named as client-go and controller-runtime do.

Dashboards and alerts written for Go operators work unchanged, so every name, label and bucket
here follows `reference/machinery.md` §2. Metrics are defined once, at import, on the default
registry; this module is only a list of definitions, the code that moves them lives with the
thing it measures (e.g. `controller/workqueue.py`).
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
