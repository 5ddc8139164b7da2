"""The operator's two admission paths and the handlers behind them."""

from __future__ import annotations

from api import constants
from webhook.admission.review import Handler
from webhook.admission.routing import Route, route_for


def admission_routes(inject: Handler, mutate: Handler) -> dict[str, Route]:
    """The operator's two webhook paths."""
    return {constants.INJECT_PATH: route_for(inject), constants.MUTATE_PATH: route_for(mutate)}
