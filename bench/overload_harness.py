"""The overload benchmark's harness (``bench_overload``): contenders, process-tree CPU, the benchmark lock, a
poster process, and the saturating burst's accounting.

A contender is a gateway configuration: agent workers (0 = the agent loops in the gateway's own process) and
admission (adaptive between floor and ceiling, or off: a fixed limit at the ceiling). Its CPU is the whole
process tree's: the gateway, its agent workers and sandbox workers (``/proc/<pid>/task/*/children``, recursively),
plus what it has already reaped. Webhooks are posted from a process of its own (``Poster``) so their ack times do
not wait behind the scripted model and the sink in this process; ``time.perf_counter`` is CLOCK_MONOTONIC, the
same clock in both processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import multiprocessing
import os
import re
import sqlite3
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from bench.bench_loop_lag import LagReading
from bench.common import (
    ROUTE,
    BenchSink,
    ServiceProcess,
    WebhookClient,
    gateway_argv,
    latency_ms,
    open_loop,
    write_gateway_config,
)
from gateway.config import GatewaySettings
from gateway.sim.model_server import ScriptedModel

LOCK = Path(tempfile.gettempdir()) / "hermes-bench.lock"  # one benchmark at a time on this machine
_CLK_TCK = os.sysconf("SC_CLK_TCK")
_STATUS = re.compile(r"webhook answered (\d+)")
DEFAULT_CEILINGS = {key: GatewaySettings.model_fields[key].default
                    for key in ("max_concurrent_runs", "max_concurrent_webhook_runs")}


# -- machine -------------------------------------------------------------------------------------------

def loadavg() -> str:
    """The first three fields of ``/proc/loadavg``."""
    with open("/proc/loadavg", encoding="ascii") as f:
        return " ".join(f.read().split()[:3])


def machine_cpu() -> float:
    """CPU seconds the whole machine spent busy so far (every process, all cores: ``/proc/stat``)."""
    with open("/proc/stat", encoding="ascii") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / _CLK_TCK  # all but idle and iowait (guest is in user)


def busy_cores(seconds: float = 2.0) -> float:
    """Cores the machine keeps busy over the next ``seconds`` (blocks)."""
    before = machine_cpu()
    time.sleep(seconds)
    return (machine_cpu() - before) / seconds


@contextlib.contextmanager
def bench_lock(scenario: str, quiet_cores: float = 0.5, wait: float = 1800.0) -> Iterator[dict[str, Any]]:
    """Hold ``LOCK`` (naming ``scenario``) while a measurement runs, waiting first while another
    benchmark holds it, then (up to ``wait`` seconds too) until the machine keeps fewer than ``quiet_cores`` busy
    without us; yields the load average and that busy share before, and the load average after on exit."""
    deadline = time.monotonic() + wait
    while True:
        try:
            fd = os.open(LOCK, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            break
        except FileExistsError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{LOCK} held for over {wait:.0f} s: {LOCK.read_text(errors='replace')!r}") from None
            print(f"  waiting for {LOCK} ({LOCK.read_text(errors='replace').strip()!r})", flush=True)
            time.sleep(10)
    with os.fdopen(fd, "w") as f:
        f.write(f"bench_overload {scenario} (pid {os.getpid()})\n")
    load: dict[str, Any] = {}
    try:
        while (busy := busy_cores()) > quiet_cores and time.monotonic() < deadline:
            print(f"  the machine keeps {busy:.2f} cores busy without us: waiting", flush=True)
            time.sleep(8)
        load.update(before=loadavg(), busy_before=round(busy, 2))
        yield load
    finally:
        load["after"] = loadavg()
        LOCK.unlink(missing_ok=True)


def _stat(pid: int) -> list[bytes]:
    with open(f"/proc/{pid}/stat", "rb") as f:
        data = f.read()
    return data[data.rindex(b")") + 2:].split()  # the command name may contain spaces


def _children(pid: int) -> set[int]:
    kids: set[int] = set()
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/children", encoding="ascii") as f:
            kids.update(int(k) for k in f.read().split())
    return kids


def tree_cpu(pid: int) -> tuple[float, float]:
    """CPU seconds (user + system) of process ``pid`` and of its descendants: the live ones and those it reaped
    (``cutime``/``cstime``). A child reaped between the two reads can be missed or counted twice (rare)."""
    fields = _stat(pid)
    own = (int(fields[11]) + int(fields[12])) / _CLK_TCK
    below = (int(fields[13]) + int(fields[14])) / _CLK_TCK
    for child in _children(pid):
        with contextlib.suppress(OSError):
            below += sum(tree_cpu(child))
    return own, below


def loop_thread(pid: int) -> tuple[float, float]:
    """Seconds the main thread of process ``pid`` (the gateway's event loop; its other threads are the store's,
    the tools' and the watchdog's) ran on a CPU, and waited for one while runnable (``/proc/.../schedstat``)."""
    with open(f"/proc/{pid}/task/{pid}/schedstat", encoding="ascii") as f:
        ran, waited, _ = f.read().split()
    return int(ran) / 1e9, int(waited) / 1e9


# -- contenders ----------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Contender:
    """A gateway configuration: ``workers`` agent workers, admission on (adaptive up to the default ceilings, or
    ``ceiling``) or off (fixed limits at the ceilings)."""

    name: str
    workers: int
    admission: bool = True
    ceiling: int | None = None
    tuning: Mapping[str, Any] = field(default_factory=dict)
    """More ``gateway.admission`` settings (``lag_target_ms``, ``webhook: {floor: ...}``...)."""

    def overrides(self) -> dict[str, Any]:
        """The config sections that make this contender (over ``write_gateway_config``'s)."""
        ceilings = {key: self.ceiling or default for key, default in DEFAULT_CEILINGS.items()}
        admission = {"enabled": self.admission, **self.tuning}
        return {"gateway": {"agent_workers": self.workers, "admission": admission, **ceilings},
                "platforms": {"webhook": {"routes": {ROUTE: {"max_concurrency": None}}}}}


def gateway_service(contender: Contender, home: Path, model_url: str, sink_url: str, **config: Any) -> ServiceProcess:
    """A gateway subprocess of ``contender`` in ``home``: ``write_gateway_config``'s config (the route's rate limit
    raised; ``config`` its other arguments) with the contender's limits and the route without a concurrency limit of
    its own."""
    home.mkdir(parents=True, exist_ok=True)
    path = write_gateway_config(home, model_url, sink_url, overrides=contender.overrides(), **config)
    return ServiceProcess(contender.name, gateway_argv(path), home / "stderr.log")


@asynccontextmanager
async def started(service: ServiceProcess, http: aiohttp.ClientSession, workers: int,
                  stop_timeout: float = 30.0) -> AsyncIterator[ServiceProcess]:
    """Start ``service`` and wait until it is ready with its ``workers`` agent workers; stop it on exit (SIGKILL
    after ``stop_timeout``) and print its distinct log problems."""
    await service.start()
    try:
        await service.wait_ready(http)
        async with asyncio.timeout(30):
            while workers and await service.gauge(http, "hermes_agent_workers") < workers:
                await asyncio.sleep(0.1)
        yield service
    finally:
        await service.stop(stop_timeout)
        for problem in service.log_problems(3):
            print(f"    {service.name} log: {problem}", flush=True)


async def metric_samples(service: ServiceProcess, http: aiohttp.ClientSession) -> dict[str, float]:
    """One scrape of ``/metrics``: every sample as ``name{label="v",...}`` (labels sorted) -> value."""
    async with http.get(service.base_url + "/metrics", timeout=aiohttp.ClientTimeout(total=10)) as resp:
        body = await resp.text()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(body):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


async def read_lag(service: ServiceProcess, http: aiohttp.ClientSession) -> LagReading:
    """The gateway's main-loop lag histogram now."""
    async with http.get(service.base_url + "/metrics", timeout=aiohttp.ClientTimeout(total=10)) as resp:
        return LagReading(await resp.text())


class Peaks:
    """Samples the gateway's gauges every ``interval`` while a load runs, keeping each one's largest value; also
    empties the scripted model's request log (which would grow by two bodies per run)."""

    GAUGES: ClassVar[dict[str, str]] = {
        "runs_in_flight": 'hermes_runs_in_flight{kind="webhook"}',
        "chat_runs_in_flight": 'hermes_runs_in_flight{kind="chat"}',
        "admission_limit": 'hermes_admission_limit{kind="webhook"}',
        "admission_waiting": 'hermes_admission_waiting{kind="webhook"}', "outbox_depth": "hermes_outbox_depth",
        "chat_admission_waiting": 'hermes_admission_waiting{kind="chat"}'}

    def __init__(self, service: ServiceProcess, http: aiohttp.ClientSession, model: ScriptedModel,
                 interval: float = 0.25) -> None:
        self.service, self.http, self.model, self.interval = service, http, model, interval
        self.peaks: dict[str, float] = {}
        self.limits: list[float] = []  # the webhook admission limit at each sample
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Peaks:
        self.model.peak_in_flight = 0
        self._task = asyncio.create_task(self._sample())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        self.peaks["model_requests_in_flight"] = self.model.peak_in_flight

    async def _sample(self) -> None:
        while True:
            self.model.requests.clear()
            self.model.peer_ports.clear()
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                samples = await metric_samples(self.service, self.http)
                for key, name in self.GAUGES.items():
                    if name in samples:
                        self.peaks[key] = max(self.peaks.get(key, 0.0), samples[name])
                if self.GAUGES["admission_limit"] in samples:
                    self.limits.append(samples[self.GAUGES["admission_limit"]])
            await asyncio.sleep(self.interval)


# -- the poster process --------------------------------------------------------------------------------

Posted = tuple[int, str, float, float]
"""One webhook: HTTP status (0: no answer), run id ("" unless 202), sent and acknowledged ``perf_counter`` times."""


def _post_webhooks(base_url: str, count: int, rate: float | None, connections: int) -> list[Posted]:
    """In the poster process: ``count`` signed webhooks at ``rate`` per second (open loop), or all at once."""
    async def go() -> list[Posted]:
        connector = aiohttp.TCPConnector(limit=connections)
        async with aiohttp.ClientSession(connector=connector) as http:
            client = WebhookClient(http, base_url, timeout=120.0)

            async def one() -> Posted:
                sent = time.perf_counter()
                try:
                    run = await client.post()
                except RuntimeError as exc:  # answered, not 202
                    match = _STATUS.search(str(exc))
                    return int(match.group(1)) if match else 0, "", sent, time.perf_counter()
                except (aiohttp.ClientError, TimeoutError):
                    return 0, "", sent, float("nan")
                return run.status, run.run_id, run.sent_at, run.acked_at

            if rate is None:
                return list(await asyncio.gather(*(one() for _ in range(count))))
            return (await open_loop(one, rate, count / rate)).results
    return asyncio.run(go())


def _pid() -> int:
    return os.getpid()


class Poster:
    """A process of its own posting webhooks (started once, before any gateway, so its start-up is not measured)."""

    def __init__(self, connections: int) -> None:
        self.connections = connections
        self._pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
        self.pid = self._pool.submit(_pid).result()

    async def post(self, base_url: str, count: int, rate: float | None = None) -> list[Posted]:
        """Post ``count`` webhooks to the gateway at ``base_url``, at ``rate`` per second or all at once."""
        job = functools.partial(_post_webhooks, base_url, count, rate, self.connections)
        return await asyncio.get_running_loop().run_in_executor(self._pool, job)

    def close(self) -> None:
        """Stop the process."""
        self._pool.shutdown()


# -- accounting ----------------------------------------------------------------------------------------

async def delivered(sink: BenchSink, run_ids: set[str], timeout: float) -> float:
    """Wait until every run of ``run_ids`` reached the sink (or ``timeout``); returns when the last one arrived
    (NaN if some did not)."""
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline and not run_ids <= sink.arrivals.keys():
        await asyncio.sleep(0.1)
    if not run_ids <= sink.arrivals.keys():
        return float("nan")
    return max((sink.arrivals[r] for r in run_ids), default=float("nan"))


def accounting(posts: list[Posted], sink: BenchSink) -> dict[str, Any]:
    """What the posts got (statuses, ack latency) and whether every accepted one reached the sink exactly once."""
    accepted = {run_id for status, run_id, _, _ in posts if status == 202}
    copies = Counter(str(body.get("run_id")) for body in sink.received)
    return {"posted": len(posts), "statuses": dict(Counter(str(p[0]) for p in posts)), "accepted": len(accepted),
            "delivered": sum(1 for r in accepted if copies[r]),
            "missing": sum(1 for r in accepted if not copies[r]),
            "duplicates": sum(n - 1 for r, n in copies.items() if n > 1),
            "unexpected": sum(1 for r in copies if r not in accepted),
            "ack": latency_ms([acked - sent for status, _, sent, acked in posts if status == 202]),
            "e2e": latency_ms([sink.arrivals[r] - sent for status, r, sent, _ in posts
                               if status == 202 and r in sink.arrivals])}


def run_stages(db: Path, kind: str, since: float = 0.0, sent: Mapping[str, float] | None = None) -> dict[str, Any]:
    """Where the runs of ``kind`` accepted since ``since`` (epoch seconds; with ``sent``, those of its sessions)
    spent their time, from the gateway's SQLite store: intake (the message sent, ``sent[session]``, to the run
    accepted), queue (accepted to started: admission, the session's order), run (started to finished), delivery
    (finished to its last part sent); each as :func:`latency_ms`."""
    query = ("SELECT r.session_key, r.created_at, r.started_at, r.finished_at, MAX(o.sent_at) FROM runs r "
             "LEFT JOIN outbox o ON o.run_id = r.id WHERE r.kind = ? AND r.created_at >= ? GROUP BY r.id")
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        rows = [r for r in conn.execute(query, (kind, since)) if sent is None or r[0] in sent]
    nan = float("nan")
    return {"intake": latency_ms([created - sent[key] for key, created, *_ in rows if sent]),
            **{stage: latency_ms([b - a if a is not None and b is not None else nan for a, b in pairs])
               for stage, pairs in (("queue", [(r[1], r[2]) for r in rows]), ("run", [(r[2], r[3]) for r in rows]),
                                    ("delivery", [(r[3], r[4]) for r in rows]))}}
