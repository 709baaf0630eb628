"""``python -m harness``: list engines; report, compare and recommend from run directories."""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from harness.engine import Availability, optionschema, registry
from harness.exceptions import RecordError
from harness.metrics.slo import parse_slos
from harness.report import compare, decision, htmlpage, matrix, matrixterm, recommend, runset
from harness.report.publicpaths import PathStyle
from harness.results import reading
from harness.results.reading import Damaged, skipped_lines


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
    console.print(_options_table(names))
    return 0 if names else 1


def _options_table(names: list[str]) -> Table:
    """Every engine's options from the schema its adapter declares (a third-party adapter
    without one is left out: its validate_options still checks)."""
    table = Table(title="engine options: --engine-opt ENGINE.OPTION=VALUE")
    for col in ("engine", "option", "values", "default", "help"):
        table.add_column(col)
    for name in names:
        try:
            schema = optionschema.schema_of(registry.load(name))
        except ImportError:  # the table above already says the adapter is broken
            continue
        for row in schema.help_rows() if schema else ():
            table.add_row(name, *(escape(cell) for cell in row))
        if schema:
            table.add_section()
    return table


def _availability(avail: Availability) -> str:
    # reasons hold pip extras such as "inference-harness[torch]": not rich markup
    if not avail.available:
        return escape(f"no: {avail.reason}")
    return escape(f"yes, but {avail.note}") if avail.note else "yes"


def _error(console: Console, exc: Exception) -> int:
    """A run that cannot be read or a file that cannot be written: said, exit 2."""
    console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False, soft_wrap=True)
    return 2


def _skipped(console: Console, skipped: tuple[Damaged, ...]) -> None:
    for line in skipped_lines(skipped):
        console.print(escape(line), highlight=False, soft_wrap=True)


def _report(args: argparse.Namespace, console: Console) -> int:
    dirs = [Path(d) for d in args.run_dirs]
    try:
        options = _decision_options(args)
    except ValueError as exc:
        return _error(console, exc)
    if args.html:
        return _html(dirs, args.out, args.skip_damaged, console, options)
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
            status = _print_matrix(run_dir, args.skip_damaged, console) or status
    return status


def _print_matrix(run_dir: Path, skip_damaged: bool, console: Console) -> int:
    """The matrix as plain text for the terminal (matrix.md's is escaped for Markdown)."""
    width = shutil.get_terminal_size((matrixterm.DEFAULT_WIDTH, 24)).columns
    try:
        text = matrixterm.terminal_table(run_dir, width, skip_damaged=skip_damaged)
    except (OSError, RecordError) as exc:
        return _error(console, exc)
    sys.stdout.write(text)
    return 0


_DECISION_OPTIONS = {
    "--slo": "slo",
    "--gpu-hour-cost": "gpu_hour_cost",
    "--energy-price": "energy_price",
}


def _decision_options(args: argparse.Namespace) -> decision.Options:
    """The SLO and prices of the report's Decision; a bad one, or one given without
    ``--html`` (only the page has a Decision), is a ValueError saying so."""
    given = [o for o, v in _DECISION_OPTIONS.items() if getattr(args, v) is not None]
    if given and not args.html:
        raise ValueError(f"{', '.join(given)}: only with --html (they set the page's Decision)")
    slos = None
    if args.slo is not None:
        try:
            slos = parse_slos(args.slo)
        except ValueError as exc:
            raise ValueError(f"bad --slo {args.slo!r}: {exc}") from None
        if not slos:
            raise ValueError(f"bad --slo {args.slo!r}: no SLO given")
    return decision.Options(slos, args.gpu_hour_cost, args.energy_price)


def _html(
    dirs: list[Path],
    out: Path | None,
    skip_damaged: bool,
    console: Console,
    options: decision.Options,
) -> int:
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
        written = htmlpage.write(runs, target, skip_damaged=skip_damaged, options=options)
    except (OSError, ValueError) as exc:  # RecordError is a ValueError
        return _error(console, exc)
    console.print(
        f"wrote {written.html}, {written.markdown}, {written.csv} "
        f"and {len(written.plots)} plot files in {target / 'plots'}",
        highlight=False,
    )
    _skipped(console, written.skipped)
    return 0


# -- compare -----------------------------------------------------------------------------


def _fraction_of_percent(text: str) -> float:
    try:
        value = float(text) / 100.0
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of percent") from exc
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"{text}% is not in [0, 100)")
    return value


def _probability(text: str) -> float:
    try:
        value = float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from exc
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"{text} is not in (0, 1)")
    return value


def _compare(args: argparse.Namespace, console: Console) -> int:
    """``compare``: print the comparison, optionally write it as JSON; the exit status."""
    try:
        comparison = compare.compare_runs(
            Path(args.base),
            Path(args.new),
            threshold=args.threshold,
            alpha=args.alpha,
            allow_env=tuple(args.allow_env),
            allow_missing=args.allow_missing,
            skip_damaged=args.skip_damaged,
            fail_within_run=args.fail_within_run,
        )
    except compare.CompareError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False, soft_wrap=True)
        return compare.EXIT_CANNOT_COMPARE
    compare.render(comparison, console)
    if args.json_path is not None:
        try:
            matrix.publish(Path(args.json_path), compare.to_json(comparison))
        except OSError as exc:
            console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False, soft_wrap=True)
            return compare.EXIT_CANNOT_COMPARE
        console.print(f"wrote {escape(str(args.json_path))}", highlight=False)
    return comparison.exit_code


def _register_compare(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "compare",
        help="compare two runs cell by cell; exit 1 on a significant regression",
        description=(
            "Per cell, the change of each headline figure NEW/BASE - 1 with a 95%% interval"
            " and a Holm-adjusted test: between repeats where both runs were made with"
            " --repeats N (N >= 2; each repeat a fresh worker process), else on the raw"
            " samples of one run each ('within-run only', which does not fail the"
            " comparison unless --fail-within-run). Latency of a cell saturated or"
            " trending in either run is not comparable. Exit 0: no significant"
            " regression; 1: a significant regression (or a cell ok in BASE that is not ok"
            " in NEW); 2: the runs cannot be compared (unreadable or damaged files, no shared"
            " cells, cells missing, environments differ). docs/methodology.md says more."
        ),
    )
    p.add_argument("base", metavar="BASE", help="run directory before the change")
    p.add_argument("new", metavar="NEW", help="run directory after the change")
    p.add_argument(
        "--threshold",
        type=_fraction_of_percent,
        default=compare.DEFAULT_THRESHOLD,
        metavar="PERCENT",
        help="smallest change called significant, in percent (default 5): smaller drifts"
        " are run-to-run noise however many samples detect them",
    )
    p.add_argument("--alpha", type=_probability, default=compare.DEFAULT_ALPHA, help="default 0.05")
    p.add_argument(
        "--allow-env-diff",
        dest="allow_env",
        action="append",
        default=[],
        metavar="PATTERN",
        help="accept environment differences in fields matching PATTERN (fnmatch, e.g."
        " 'packages.onnxruntime' or 'packages.*'); repeatable",
    )
    p.add_argument(
        "--allow-missing",
        action="store_true",
        help="compare the shared cells even when some cells are in one run only",
    )
    p.add_argument(
        "--fail-within-run",
        action="store_true",
        help="also exit 1 on a regression judged within one run only (runs made without"
        " --repeats): by default it is reported but does not fail, since one run's"
        " requests share its machine state and overstate significance between runs",
    )
    p.add_argument("--json", dest="json_path", metavar="PATH", help="also write the comparison")
    reading.add_skip_damaged(p)
    p.set_defaults(func=_compare)


# -- recommend ---------------------------------------------------------------------------


def _register_recommend(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "recommend",
        help="the engine and configuration to run per workload under an SLO",
        description=recommend.__doc__.split("\n\n")[0] if recommend.__doc__ else None,
    )
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    p.add_argument(
        "--slo",
        help=SLO_HELP + " (left out: no SLO, each question ranked by throughput)",
    )
    p.add_argument("--gpu-hour-cost", type=float, metavar="X", help=GPU_HOUR_HELP)
    p.add_argument("--energy-price", type=float, metavar="X", help=ENERGY_PRICE_HELP)
    p.add_argument("--json", metavar="PATH", help="also write the recommendation as JSON")
    reading.add_skip_damaged(p)
    p.set_defaults(func=_recommend)


def _recommend(args: argparse.Namespace, console: Console) -> int:
    try:
        slos = parse_slos(args.slo) if args.slo is not None else ()
        if args.slo is not None and not slos:
            raise ValueError("no SLO given")
    except ValueError as exc:
        return _recommend_usage(
            console, f"bad --slo {args.slo!r}: {exc}; give e.g. --slo e2e_p99=50ms,ttft_p99=200ms"
        )
    try:
        rec = recommend.recommend(
            [Path(p) for p in args.run_dirs],
            slos,
            args.gpu_hour_cost,
            energy_price=args.energy_price,
            skip_damaged=args.skip_damaged,
        )
    except recommend.RecommendError as exc:
        return _recommend_usage(console, str(exc))
    # what it prints is the published recommendation too (scripts/example-report keeps it)
    paths = PathStyle.here()
    text = paths.text(recommend.render(rec))
    console.print(text, markup=False, highlight=False, soft_wrap=True, end="")
    if args.json:
        try:
            matrix.publish(Path(args.json), paths.text(recommend.to_json(rec).decode()).encode())
        except OSError as exc:
            return _recommend_usage(console, str(exc))
        wrote = paths.path(args.json)
        console.print(f"wrote {wrote}", markup=False, highlight=False, soft_wrap=True)
    return rec.exit_code


def _recommend_usage(console: Console, message: str) -> int:
    console.print(f"error: {message}", markup=False, highlight=False, soft_wrap=True)
    return recommend.EXIT_USAGE


SLO_HELP = (
    "comma-separated METRIC_pNN=DURATION (METRIC: a latency the runs' workloads declare:"
    " ttft, tpot, e2e, itl for the built-in ones, or a workload's own; units s, ms, us),"
    " e.g. ttft_p99=200ms,tpot_p99=50ms,e2e_p99=2s"
)
GPU_HOUR_HELP = (
    "cost of one hour of the machine (any currency): rank by cost per 1M output tokens /"
    " 1k requests or images"
)
ENERGY_PRICE_HELP = (
    "price of one kWh (the same currency): add the GPU energy each configuration used (its"
    " record's metrics.energy, from NVML) to its cost and rank by the sum; where a record"
    " has no energy figure the output says energy was not included, and why"
)


def _add_decision_options(rep: argparse.ArgumentParser) -> None:
    rep.add_argument(
        "--slo",
        help="with --html: the SLO the Decision ranks under (default: the SLO the runs were"
        " measured with, else none: ranked by throughput); " + SLO_HELP,
    )
    rep.add_argument(
        "--gpu-hour-cost", type=float, metavar="X", help="with --html: " + GPU_HOUR_HELP
    )
    rep.add_argument(
        "--energy-price", type=float, metavar="X", help="with --html: " + ENERGY_PRICE_HELP
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m harness", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    eng = sub.add_parser("engines", help="list registered engines and whether they can run here")
    eng.add_argument("--device", help="one device to probe for (default: cpu and cuda)")
    eng.set_defaults(func=_engines)
    rep = sub.add_parser(
        "report",
        help="write matrix.md and matrix.csv into each run directory, or with --html one "
        "self-contained HTML report over all of them: the Decision (engine and configuration"
        " to run, Pareto fronts), the runs, the matrix and plots",
    )
    rep.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", type=Path)
    rep.add_argument("--print", action="store_true", help="also print the matrix (as plain text)")
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
    _add_decision_options(rep)
    reading.add_skip_damaged(rep)
    rep.set_defaults(func=_report)
    _register_compare(sub)
    _register_recommend(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    console = Console(stderr=False, width=200)
    code: int = args.func(args, console)
    return code
