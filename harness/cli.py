"""``python -m harness``: list engines, build a run's result matrix."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from harness import registry, report
from harness.records import RecordError


def _engines(args: argparse.Namespace, console: Console) -> int:
    table = Table(title=f"registered engines (device {args.device})")
    for col in ("engine", "family", "devices", "available here", "reason", "adapter"):
        table.add_column(col)
    rows = [registry.status(name, args.device) for name in registry.names()]
    for row in rows:
        table.add_row(
            row.name,
            row.family,
            ",".join(row.devices),
            "yes" if row.availability.available else "no",
            row.availability.reason,
            row.source,
        )
    console.print(table)
    return 0 if rows else 1


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
    eng.add_argument("--device", default="cpu", help="device to probe for (default: cpu)")
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
