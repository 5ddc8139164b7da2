"""Generic admission toolkit: HTTPS serving, TLS, AdmissionReview, JSON patch, certificates.

Knows nothing of Lumigo (an import-linter contract in `make lint` holds this): the Lumigo
handlers and the pod-template mutation are in `webhook/` and are handed to this toolkit.
"""
