"""``python -m harness``: list engines; report, compare and recommend from run directories."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from harness.engine import Availability, registry
from harness.report import compare, htmlpage, matrix, recommend, runset
from harness.results import reading
from harness.results.reading import Damaged, skipped_lines
from harness.results.records import RecordError


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


def _error(console: Console, exc: Exception) -> int:
    """A run that cannot be read or a file that cannot be written: said, exit 2."""
    console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False, soft_wrap=True)
    return 2


def _skipped(console: Console, skipped: tuple[Damaged, ...]) -> None:
    for line in skipped_lines(skipped):
        console.print(escape(line), highlight=False, soft_wrap=True)


def _report(args: argparse.Namespace, console: Console) -> int:
    dirs = [Path(d) for d in args.run_dirs]
    if args.html:
        return _html(dirs, args.out, args.skip_damaged, console)
    status = 0
    for run_dir in dirs:
        try:
            written = matrix.publish_run(run_dir, skip_damaged=args.skip_damaged)
        except (OSError, RecordError) as exc:
            status = _error(console, exc)
            continue
        console.print(f"wrote {written.markdown} and {written.csv}", highlight=False)
        _skipped(console, written.skipped)
        if args.print:
            sys.stdout.write(written.markdown.read_text())
    return status


def _html(dirs: list[Path], out: Path | None, skip_damaged: bool, console: Console) -> int:
    if out is None and len(dirs) > 1:
        console.print(
            "[red]error:[/red] several run directories merge into one report: "
            "say where it goes with --out DIR",
            highlight=False,
        )
        return 2
    target = out if out is not None else dirs[0]
    try:
        runs = runset.load(dirs, skip_damaged=skip_damaged)
        written = htmlpage.write(runs, target, skip_damaged=skip_damaged)
    except (OSError, ValueError) as exc:  # RecordError is a ValueError
        return _error(console, exc)
    console.print(
        f"wrote {written.html}, {written.markdown}, {written.csv} "
        f"and {len(written.plots)} plot files in {target / 'plots'}",
        highlight=False,
    )
    _skipped(console, written.skipped)
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m harness", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    eng = sub.add_parser("engines", help="list registered engines and whether they can run here")
    eng.add_argument("--device", help="one device to probe for (default: cpu and cuda)")
    eng.set_defaults(func=_engines)
    rep = sub.add_parser(
        "report",
        help="write matrix.md and matrix.csv into each run directory, or with --html one "
        "self-contained HTML report (with plots) over all of them",
    )
    rep.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", type=Path)
    rep.add_argument("--print", action="store_true", help="also print matrix.md")
    rep.add_argument(
        "--html",
        action="store_true",
        help="merge the runs into report.html, plots/ and matrix.md/.csv (in --out DIR)",
    )
    rep.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help="where the --html report goes (default: the run directory, when only one)",
    )
    reading.add_skip_damaged(rep)
    rep.set_defaults(func=_report)
    compare.register(sub)
    recommend.register(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    console = Console(stderr=False, width=200)
    code: int = args.func(args, console)
    return code
