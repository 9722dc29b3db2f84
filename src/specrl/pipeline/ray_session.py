"""Connecting to Ray: a local instance on this machine's cores by default, or an existing cluster.

Ray's own logging goes to stderr at WARNING, and no dashboard is started, so a
command's stdout still ends with its one JSON line. A session joins a Ray that is
already initialised in the process (a test's, a notebook's) and then leaves it running.
"""
from __future__ import annotations

import logging
import os

import ray


class RaySession:
    def __init__(self, address: str | None = None):
        self.owned = not ray.is_initialized()
        if self.owned:
            local = {"num_cpus": os.cpu_count() or 1} if address is None else {}
            ray.init(address=address, include_dashboard=False, logging_level=logging.WARNING,
                     log_to_driver=True, **local)

    def close(self) -> None:
        if self.owned and ray.is_initialized():
            ray.shutdown()
