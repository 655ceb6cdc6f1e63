"""The bypass suite's one shared fixture (defined once here, so every module
shares one session-wide bench per worker)."""
from bypass_bench import bench  # noqa: F401
