"""A small client for gpusched's REST API, and the `gpusched` command line."""

from gpusched_client.client import Client, GpuschedError

__all__ = ["Client", "GpuschedError"]
