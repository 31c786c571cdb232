"""Adaptive admission: how many runs of each kind go on at once follows the gateway's measured health.

Each kind (chat with background and API runs, cron, webhook runs of all routes, each webhook route) has an
``AdaptiveLimit``: a FIFO semaphore whose limit changes at run time, between the kind's floor and ceiling
(``GatewaySettings.run_limits``). Every ``gateway.admission.interval`` a ``GradientController`` reads the
health of the last interval (the main loop's lag p99, the worst agent worker's, the median model call) and
sets each limit, in the manner of Netflix's Gradient2 and Envoy's adaptive concurrency:

- trouble multiplies every limit by the gradient ``target / measured``, bounded to [0.5, 1]. Trouble is a
  loop lagging past the target in each of the last two intervals (one interval's spike, a batch of runs
  ending together or a collection, is not enough), or model calls slower than ``latency_tolerance`` times
  their long-term average. A decrease takes effect as runs end, so none follows while runs still hold more
  slots than the limit;
- a limit runs had to wait for grows when the last interval was healthy, never past what they asked for:
  doubling (slow start) until its first decrease; after one, by sqrt(limit), a step doubling with each
  healthy interval in a row (back to doubling), so it comes back fast but slows down near where trouble was;
- a limit nobody waited for stays where it is.

Accepting (inbox write, ack) takes no slot: only run work waits here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import statistics
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import TracebackType

from gateway.config import GatewaySettings, WebhookRoute
from gateway.metrics import Metrics

logger = logging.getLogger(__name__)

LagSource = Callable[[], float | None]
"""A loop's lag p99 in seconds since the last call; None when there is nothing to measure."""
_MIN_GRADIENT = 0.5  # the most one interval's decrease takes away: half
_SLOW_START = 64  # a streak this long grows by doubling (2**streak * sqrt(limit) >= limit for any limit)
_LATENCY_WINDOW = 4096  # model call latencies kept per interval
_LAG_WINDOW = 2  # intervals in a row a loop must lag in to count as trouble
PACE = 16  # waiters a raise hands slots to per event-loop iteration
_BASELINE_RISE, _BASELINE_FALL = 0.02, 0.2  # per interval: the long-term latency follows a faster model sooner


def _no_lag() -> float | None:
    return None


class AdaptiveLimit:
    """A semaphore whose limit changes at run time: waiters are served first come first served; raising the
    limit wakes them, ``PACE`` per loop iteration (a large raise starts its runs over several iterations, the loop
    serving I/O in between, rather than in one long one); lowering it takes no slot back (``in_flight`` may stay
    above ``limit`` until releases). A waiter cancelled after it was handed a slot gives it to the next one, as
    with ``asyncio.Semaphore``."""

    __slots__ = ("_in_flight", "_limit", "_pacing", "_peak", "_waiters", "ceiling", "floor", "name")

    def __init__(self, name: str, floor: int, ceiling: int, limit: int | None = None) -> None:
        if not 1 <= floor <= ceiling:
            raise ValueError(f"limit {name}: need 1 <= floor ({floor}) <= ceiling ({ceiling})")
        self.name = name
        self.floor = floor
        self.ceiling = ceiling
        self._limit = min(max(floor if limit is None else limit, floor), ceiling)
        self._in_flight = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._peak = 0  # the most runs in flight or waiting at once since take_demand()
        self._pacing = False  # a _paced_wake is scheduled

    @property
    def limit(self) -> int:
        return self._limit

    @property
    def in_flight(self) -> int:
        """Slots held (including slots handed to waiters that have not resumed yet)."""
        return self._in_flight

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def locked(self) -> bool:
        """Whether ``acquire()`` would wait: no room, or others waiting first (while a raise hands out slots)."""
        return self._in_flight >= self._limit or any(not waiter.done() for waiter in self._waiters)

    def set_limit(self, value: int) -> None:
        """Set the limit, clamped to [floor, ceiling]; waiters it makes room for get their slots in order."""
        self._limit = min(max(value, self.floor), self.ceiling)
        self._wake()

    def note_demand(self, runs: int) -> None:
        """``runs`` want a slot (or hold one) now, counted for ``take_demand`` though not all wait here."""
        self._peak = max(self._peak, runs)

    def take_demand(self) -> int:
        """The most runs that held or waited for a slot at once since the last call."""
        peak, self._peak = self._peak, self._in_flight + len(self._waiters)
        return max(peak, self._peak)

    async def acquire(self) -> bool:
        """Take a slot, waiting in line for one when none is free."""
        if not self.locked():
            self._in_flight += 1
            self._peak = max(self._peak, self._in_flight + len(self._waiters))
            return True
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        self._peak = max(self._peak, self._in_flight + len(self._waiters))
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():  # handed a slot, then cancelled: pass it on
                self.release()
            else:
                with contextlib.suppress(ValueError):  # _wake may have dropped it already
                    self._waiters.remove(waiter)
            raise
        return True

    def release(self) -> None:
        """Give a slot back: to the first waiter, while the (maybe lowered) limit has room."""
        if self._in_flight <= 0:
            raise ValueError(f"limit {self.name} released more often than acquired")
        self._in_flight -= 1
        self._wake()

    def _wake(self) -> None:
        # Slots are handed over here (counted before the waiter resumes), so nobody arriving meanwhile barges in.
        if self._pacing:
            return
        handed = 0
        while self._in_flight < self._limit and self._waiters:
            if handed == PACE:
                self._pacing = True
                asyncio.get_running_loop().call_soon(self._paced_wake)
                return
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                self._in_flight += 1
                handed += 1

    def _paced_wake(self) -> None:
        self._pacing = False
        self._wake()

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.release()


@dataclass(frozen=True, slots=True)
class Health:
    """One interval's measurements, in seconds: the main loop's lag p99, the worst agent worker's lag p99 (None:
    no workers) and the median model call that ended in it (None: none did)."""

    loop_lag: float | None
    worker_lag: float | None = None
    model_latency: float | None = None


@dataclass(slots=True)
class _Estimate:
    value: float
    streak: int = _SLOW_START  # healthy growth intervals since the last decrease


class GradientController:
    """Sets limits from health, one ``step`` per interval (the caller keeps time)."""

    def __init__(self, lag_target: float, latency_tolerance: float) -> None:
        self.lag_target = lag_target
        self.latency_tolerance = latency_tolerance
        self.baseline: float | None = None  # long-term model latency
        self._lags: deque[float] = deque(maxlen=_LAG_WINDOW)
        self._estimates: dict[str, _Estimate] = {}

    def assess(self, health: Health) -> tuple[float, bool]:
        """How much the limits shrink now (1: not at all, else down to ``_MIN_GRADIENT``) and whether they may grow;
        takes in the interval's lag and model latency."""
        lags = [lag for lag in (health.loop_lag, health.worker_lag) if lag is not None]
        if lags:
            self._lags.append(max(lags))
        sustained = min(self._lags, default=0.0)
        gradient = min(1.0, self.lag_target / sustained) if sustained > 0 else 1.0
        grow = not lags or max(lags) <= self.lag_target
        latency = health.model_latency
        if latency is not None and latency > 0:
            if self.baseline is None:
                self.baseline = latency
            allowed = self.latency_tolerance * self.baseline
            if latency > allowed:
                gradient = min(gradient, allowed / latency)
            self.baseline += (latency - self.baseline) * (_BASELINE_RISE if latency > self.baseline else _BASELINE_FALL)
        return max(_MIN_GRADIENT, gradient), grow and gradient == 1

    def step(self, health: Health, limits: Iterable[AdaptiveLimit]) -> None:
        """Set each limit for the next interval."""
        gradient, grow = self.assess(health)
        for limit in limits:
            limit.set_limit(self._next(limit, gradient, grow))

    def _next(self, limit: AdaptiveLimit, gradient: float, grow: bool) -> int:
        est = self._estimates.setdefault(limit.name, _Estimate(limit.limit))
        demand = limit.take_demand()
        if gradient < 1:
            # Not while runs hold more slots than the limit (the last decrease has not taken effect yet), nor at
            # the floor: a limit that could not go lower keeps its slow start for when health comes back.
            if limit.in_flight <= limit.limit and est.value > limit.floor:
                est.value *= gradient
                est.streak = 0
        elif grow and demand > limit.limit:  # runs waited: grow towards what they asked for
            step = min(est.value, math.sqrt(est.value) * 2 ** min(est.streak, _SLOW_START))
            est.value = min(est.value + step, demand)
            est.streak += 1
        est.value = min(max(est.value, limit.floor), limit.ceiling)
        return int(est.value)


class Admission:
    """The run limits of one gateway (``slots_of``) and the task adapting them while ``gateway.admission`` is on.

    ``observe_model`` is told each model call's seconds (``Agent.on_model_seconds``)."""

    def __init__(self, settings: GatewaySettings, routes: Mapping[str, WebhookRoute], metrics: Metrics) -> None:
        self.settings = settings
        bounds = settings.run_limits()
        self.chat, self.cron, self.webhook = (AdaptiveLimit(kind, *bounds[kind])
                                              for kind in ("chat", "cron", "webhook"))
        self._routes = {name: self._route_limit(name, route.max_concurrency) for name, route in routes.items()}
        a = settings.admission
        self.controller = GradientController(a.lag_target_ms / 1000, a.latency_tolerance)
        self._latencies: deque[float] = deque(maxlen=_LATENCY_WINDOW)
        self._main_lag: LagSource = _no_lag
        self._worker_lag: LagSource = _no_lag
        self._task: asyncio.Task[None] | None = None
        metrics.watch_admission(lambda: [(x.name, x.limit, x.in_flight, x.waiting) for x in self.limits()])

    def _route_limit(self, name: str, ceiling: int | None) -> AdaptiveLimit:
        floor, webhook_ceiling = self.settings.run_limits()["webhook"]
        ceiling = ceiling or webhook_ceiling
        return AdaptiveLimit(f"webhook:{name}", min(floor, ceiling) if self.settings.admission.enabled else ceiling,
                             ceiling)

    def limits(self) -> list[AdaptiveLimit]:
        """Every limit: chat, cron, webhook, then each route's."""
        return [self.chat, self.cron, self.webhook, *self._routes.values()]

    def slots_of(self, kind: str, source: str) -> tuple[AdaptiveLimit, ...]:
        """The limits a run of ``kind`` from ``source`` takes a slot of, in order. A webhook run takes its route's
        first: runs queued behind a busy route must not hold webhook slots other routes could use."""
        if kind == "webhook":
            route = self._routes.get(source)
            if route is None:  # a route no longer configured, with runs left in the inbox
                route = self._routes[source] = self._route_limit(source, None)
            return route, self.webhook
        return (self.cron,) if kind == "cron" else (self.chat,)

    def observe_model(self, seconds: float) -> None:
        """One model call took ``seconds``."""
        self._latencies.append(seconds)

    def sample(self) -> Health:
        """The health of the interval since the last sample."""
        latencies = list(self._latencies)
        self._latencies.clear()
        return Health(self._main_lag(), self._worker_lag(), statistics.median(latencies) if latencies else None)

    def step(self, health: Health) -> None:
        """Adapt every limit to ``health``."""
        # Runs waiting for their route's slot want webhook slots too: the webhook limit grows with its routes.
        self.webhook.note_demand(sum(route.in_flight + route.waiting for route in self._routes.values()))
        self.controller.step(health, self.limits())
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("admission %s: %s", health, {x.name: (x.limit, x.in_flight, x.waiting) for x in self.limits()})

    def start(self, main_lag: LagSource, worker_lag: LagSource = _no_lag) -> None:
        """Adapt the limits every interval from now on (nothing to do with admission off)."""
        self._main_lag, self._worker_lag = main_lag, worker_lag
        if self.settings.admission.enabled and self._task is None:
            self._task = asyncio.create_task(self._run(), name="admission")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.settings.admission.interval)
            try:
                self.step(self.sample())
            except Exception:  # the limits stay as they are; the next interval tries again
                logger.exception("admission: adapting the run limits failed")
