"""``python -m benchmarks.noop_server``: the harness's no-op OpenAI streaming server
(harness.load.noopserver), as the benchmarks and older command lines start it."""

from harness.load.noopserver import free_port, main, serve, start

__all__ = ["free_port", "main", "serve", "start"]

if __name__ == "__main__":
    main()
