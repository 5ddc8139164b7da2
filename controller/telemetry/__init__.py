"""The telemetry proxy: its collector configuration and the reconciler that keeps it current."""
