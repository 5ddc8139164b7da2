"""Our envtest: a real, throw-away Kubernetes control plane (`envtest.cluster`), a real node
(`envtest.node`), the operator as a local process (`envtest.operator`), the OCI images they import
(`envtest.ociimage`), and the process supervisor and `wait_until` they share (`envtest.process`).

Used by the tests (tests/), `make run` (hack/run-local) and the benchmarks (bench/). Nothing here
is part of the product: the operator image carries only api/, webhook/, controller/ (and kube/).
"""
