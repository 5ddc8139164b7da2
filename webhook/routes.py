"""The operator's two admission paths and the handlers behind them."""

from __future__ import annotations

from api import constants
from kube.http.routing import Route
from webhook.admission_review import Handler, route_for


def admission_routes(inject: Handler, mutate: Handler) -> dict[str, Route]:
    """The operator's two webhook paths."""
    return {constants.INJECT_PATH: route_for(inject), constants.MUTATE_PATH: route_for(mutate)}
