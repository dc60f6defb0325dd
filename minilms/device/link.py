"""Host-device link models for the ``cpu`` device: a copy takes at least ``bytes / bandwidth``.

Bandwidths are per direction, as one copy uses one direction. The LMS documents quote both
directions added together ("NVLink 2.0 150 GB/s" against "PCIe 3.0 32 GB/s" on the AC922 and its
x86 rival), so their figures are halved here; the ratio between the links is the same.
"""
import time

from ..errors import ConfigError

GB = 10**9
LINKS_GBPS = {"pcie3": 16.0, "pcie4": 32.0, "pcie5": 64.0, "nvlink2": 75.0}


class Link:
    def __init__(self, name: str, gbps: float):
        self.name, self.gbps = name, gbps
        self.bytes_per_second = gbps * GB

    def min_seconds(self, nbytes: int) -> float:
        return nbytes / self.bytes_per_second

    def hold(self, started: float, nbytes: int) -> None:
        """Wait until a copy of ``nbytes`` begun at ``started`` has taken as long as the link
        needs."""
        until = started + self.min_seconds(nbytes)
        remaining = until - time.perf_counter()
        if remaining > 2e-3:
            time.sleep(remaining - 1e-3)  # sleep most of it; spin the last bit, sleep is coarse
        while time.perf_counter() < until:
            pass

    def __repr__(self) -> str:
        return f"Link({self.name}, {self.gbps:g} GB/s)"


def parse_link(value, key: str = "device.link") -> Link | None:
    """``None``/``"none"`` (copies as fast as memory allows), a link name, or a number in GB/s."""
    if value is None or (isinstance(value, str) and value.lower() in ("none", "")):
        return None
    if isinstance(value, str) and value.lower() in LINKS_GBPS:
        return Link(value.lower(), LINKS_GBPS[value.lower()])
    try:
        gbps = float(value)
    except (TypeError, ValueError):
        gbps = -1.0
    if isinstance(value, bool) or not 0 < gbps < float("inf"):
        names = ", ".join(LINKS_GBPS)
        raise ConfigError(key, f"one of {names}, none, or a finite bandwidth in GB/s > 0",
                          value)
    return Link(f"{gbps:g}GB/s", gbps)
