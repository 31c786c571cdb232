"""A token bucket, shared by adapters (webhook routes) and the gateway (per-user limits)."""

from __future__ import annotations


class TokenBucket:
    """``capacity`` tokens, refilled at ``rate`` tokens per second."""

    __slots__ = ("capacity", "rate", "stamp", "tokens")

    def __init__(self, rate: float, capacity: float, now: float) -> None:
        self.rate = rate
        self.capacity = capacity
        self.tokens = float(capacity)
        self.stamp = now

    def take(self, now: float) -> float:
        """0 when a token was taken, else the seconds until one is available."""
        self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / self.rate
