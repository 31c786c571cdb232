"""Benchmarks of the gateway core; each prints a table and writes JSON to ``bench/results/``.

Run them with ``make bench`` (everything but the long soak) or one at a time, e.g.
``python -m bench.bench_webhook --help``. Results and the method are in ``bench/RESULTS.md``.
"""
