"""Generic controller runtime: kube client, resources, informer, store, work queue, rate
limiters, leader election, manager, health, metrics, logs, events.

Knows nothing of Lumigo (an import-linter contract in `make lint` holds this).
"""
