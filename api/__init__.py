"""Lumigo v1alpha1 API: the resource model, its schemas and the shared constants. No I/O."""

__version__ = "0.1.0"
