"""Load generation: the clock, arrival schedules (``arrivals``), the open-loop serving loop
and harness-side batching for tensor engines (``serving``), the streaming driver for
generative engines (``streamdriver``), capacity search (``capacity``), client processes
(``clients``), and the summaries of what a load run recorded (``serve_summary`` for tensor
traces, ``stream_summary`` for streamed requests). Builds on ``engine`` and ``metrics``.
"""
