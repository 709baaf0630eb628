"""``python -m harness``: list engines, build a run's result matrix."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from harness import registry, report
from harness.engine import Availability
from harness.records import RecordError


def _engines(args: argparse.Namespace, console: Console) -> int:
    devices = [args.device] if args.device else ["cpu", "cuda"]
    table = Table(title="registered engines: can each run here, and if not, why")
    for col in ("engine", "family", "devices", *devices, "adapter"):
        table.add_column(col)
    names = registry.names()
    for name in names:
        statuses = [registry.status(name, device) for device in devices]
        first = statuses[0]
        table.add_row(
            first.name,
            first.family,
            ",".join(first.devices),
            *(_availability(s.availability) for s in statuses),
            first.source,
        )
    console.print(table)
    return 0 if names else 1


def _availability(avail: Availability) -> str:
    # reasons hold pip extras such as "inference-harness[torch]": not rich markup
    return "yes" if avail.available else escape(f"no: {avail.reason}")


def _report(args: argparse.Namespace, console: Console) -> int:
    status = 0
    for run_dir in args.run_dirs:
        try:
            md, csv_path = report.write(Path(run_dir))
        except (FileNotFoundError, RecordError) as exc:
            console.print(f"[red]error:[/red] {exc}", highlight=False)
            status = 2
            continue
        console.print(f"wrote {md} and {csv_path}", highlight=False)
        if args.print:
            sys.stdout.write(md.read_text())
    return status


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m harness", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    eng = sub.add_parser("engines", help="list registered engines and whether they can run here")
    eng.add_argument("--device", help="one device to probe for (default: cpu and cuda)")
    eng.set_defaults(func=_engines)
    rep = sub.add_parser("report", help="write matrix.md and matrix.csv into each run directory")
    rep.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    rep.add_argument("--print", action="store_true", help="also print matrix.md")
    rep.set_defaults(func=_report)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    console = Console(stderr=False, width=200)
    code: int = args.func(args, console)
    return code
