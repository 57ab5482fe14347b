"""Benchmarks: codec micro-benchmark, outbox relay, end-to-end throughput."""
