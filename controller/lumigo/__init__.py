"""The `Lumigo` controller: reconciler, status, instrumentation of workloads, uninstall."""
