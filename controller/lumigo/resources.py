"""Where the `Lumigo` kind lives in the REST API (the runtime's catalogue knows only core kinds)."""

from __future__ import annotations

from api import constants
from controller.runtime.resources import Resource

LUMIGOES = Resource(constants.API_VERSION, constants.KIND, constants.PLURAL)
