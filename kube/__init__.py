"""The neutral Kubernetes layer both the webhook and the controller stand on.

REST resources and the API error (`rest`), certificates and the certificate manager, delegated
authentication, JSON patch and resource quantities, and the HTTP(S) server (`kube.http`). It
knows nothing of Lumigo, of `api/`, `webhook/` or `controller/` (import-linter contracts in
`make lint` hold this): what is Lumigo's is passed in by the wiring.
"""
