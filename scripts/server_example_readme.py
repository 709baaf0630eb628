"""Write the README of results/example/vllm-server from its run: the cell, the
reconciliation table (harness.report.peersplot's) and the client-versus-server means.

    python scripts/server_example_readme.py RUN_DIR OUT.md
"""

from __future__ import annotations

import sys
from pathlib import Path

from harness.report.peersplot import COLUMNS, table
from harness.results import store


def _ms(seconds: object) -> str:
    return f"{seconds * 1e3:.2f}" if isinstance(seconds, int | float) else "-"


def main(run_dir: Path, out: Path) -> None:
    (record,) = store.read_records(run_dir)
    peers, server = record.metrics["peers"], record.metrics["server"]
    labels, rows = table(peers)
    header = " | ".join(f"{m.upper()} {q} (ms)" for m, q in COLUMNS)
    lines = [
        "# Example: the server's view of a vLLM cell",
        "",
        f"Cell `{record.cell_id}` ({record.engine_info.get('engine')} against the vLLM "
        f"{record.engine_info.get('version')} OpenAI server the harness started on loopback, "
        "CPU), rebuilt by `scripts/example-server-report`. `report.html` and "
        "`plots/server-*.svg` show the client's TTFT and E2E over time above the server's "
        "requests running and waiting and its KV-cache usage, on one time axis.",
        "",
        "## The same requests under each tool's definitions",
        "",
        f"| tool | {header} |",
        "|---|" + "---|" * len(COLUMNS),
        *(
            f"| {label} | " + " | ".join(row) + " |"
            for label, row in zip(labels, rows, strict=True)
        ),
        "",
        "Where they differ: " + " ".join(str(d) for d in peers.get("differences", [])),
        "",
        "## Client versus server (means over the cell)",
        "",
        "| | client (ms) | server (ms) | gap (ms) |",
        "|---|---|---|---|",
    ]
    versus = server["client_vs_server"]
    for what in ("ttft", "e2e"):
        means = [versus[side].get(f"{what}_mean_s") for side in ("client", "server")]
        gap = versus["gap"].get(f"{what}_s")
        lines.append(f"| {what.upper()} | " + " | ".join(_ms(v) for v in (*means, gap)) + " |")
    lines += [
        "",
        f"{server['scrapes']} scrapes of `/metrics`, {server['failed']} failed, "
        f"{server['scrape_ms']['mean']:.2f} ms each on average.",
        "",
    ]
    out.write_text("\n".join(lines))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
