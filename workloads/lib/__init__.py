"""The built-in workloads' library: the embedded models and inputs, traffic (datasets,
traces, prompts, sessions), and the workload bodies the test modules in ``workloads/``
share. It is the project's own code and may import the harness's modules directly; a
workload of your own imports ``harness.api`` (docs/api.md)."""
