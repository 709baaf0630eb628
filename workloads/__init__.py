"""Benchmark workloads (test_*.py) and the embedded default models and inputs they use."""
