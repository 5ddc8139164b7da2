"""The HTTP(S) server: bounded HTTP/1.1 protocol, ASGI app, request and response messages, body
memory plan, serving TLS, readiness, routes and the server's metrics. Serves the webhook's
AdmissionReview routes and the controller's probe and metrics endpoints alike."""
