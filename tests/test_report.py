from harness.report import matrix
from harness.results import store
from harness.results.records import Status
from tests.support.records_factory import manifest, record


def make_run(tmp_path, *, with_missing=False):
    run = store.new_run_dir(tmp_path)
    cells = [
        ("b.onnx.r=10.static", "onnx", {"rate": 10.0, "mode": "static"}),
        ("b.onnx.r=10.dynamic", "onnx", {"rate": 10.0, "mode": "dynamic"}),
        ("b.other.r=10.static", "other", {"rate": 10.0, "mode": "static"}),
        ("b.other.r=10.dynamic", "other", {"rate": 10.0, "mode": "dynamic"}),
    ]
    store.write_manifest(run, manifest(cells, run_id=run.name))
    recs = [
        record(cells[0][0], run_id=run.name, engine="onnx", params=cells[0][2], p50=0.0368),
        record(cells[1][0], run_id=run.name, engine="onnx", params=cells[1][2], p50=0.00275),
        record(
            cells[2][0], run_id=run.name, engine="other", params=cells[2][2], status=Status.INVALID
        ),
    ]
    if not with_missing:
        recs.append(
            record(
                cells[3][0],
                run_id=run.name,
                engine="other",
                params=cells[3][2],
                status=Status.SKIPPED,
                reasons=("other needs an NVIDIA GPU; none found",),
            )
        )
    for r in recs:
        store.write_record(run, r)
    return run


def test_matrix_markdown_shows_numbers_only_for_ok_cells(tmp_path):
    run = make_run(tmp_path)
    md_path, _ = matrix.write(run)
    md = md_path.read_text()
    assert "| rate | mode | onnx | other |" in md
    assert "| 10 | static | p50 36.8 ms | INVALID: too few samples |" in md
    assert "| 10 | dynamic | p50 2.75 ms | SKIPPED: other needs an NVIDIA GPU; none found |" in md


def test_matrix_is_byte_identical_when_rebuilt(tmp_path):
    run = make_run(tmp_path)
    md1, csv1 = (p.read_bytes() for p in matrix.write(run))
    md2, csv2 = (p.read_bytes() for p in matrix.write(run))
    assert (md1, csv1) == (md2, csv2)


def test_missing_records_show_as_missing(tmp_path):
    run = make_run(tmp_path, with_missing=True)
    m = matrix.build(store.read_manifest(run), store.read_records(run))
    texts = [matrix.entry_text(r.entries.get("other")) for r in m.rows]
    assert texts[1] == "MISSING (no record: interrupted?)"


def test_csv_has_numbers_for_ok_and_status_for_the_rest(tmp_path):
    run = make_run(tmp_path)
    _, csv_path = matrix.write(run)
    lines = csv_path.read_text().splitlines()
    assert lines[0].split(",") == [
        "workload",
        "rate",
        "mode",
        "onnx:status",
        "onnx:reasons",
        "onnx:p50 [ms]",
        "other:status",
        "other:reasons",
        "other:p50 [ms]",
    ]
    assert lines[1] == "batching,10,static,ok,,36.8,invalid,too few samples,"
    assert lines[2].startswith("batching,10,dynamic,ok,,2.75,skipped,")


def test_markdown_escapes_pipes_from_engine_strings(tmp_path):
    run = store.new_run_dir(tmp_path)
    store.write_manifest(run, manifest([("c.e.x=1", "e", {"x": 1})], run_id=run.name))
    store.write_record(
        run,
        record(
            "c.e.x=1",
            run_id=run.name,
            engine="e",
            params={"x": 1},
            status=Status.FAILED,
            reasons=("bad | value",),
        ),
    )
    assert "FAILED: bad \\| value" in matrix.write(run)[0].read_text()


def test_number_formatting():
    assert matrix.fmt_number(0.000123) == "0.000123"
    assert matrix.fmt_number(2.754) == "2.75"
    assert matrix.fmt_number(36.84) == "36.8"
    assert matrix.fmt_number(138.6) == "139"
    assert matrix.fmt_number(8.0) == "8"
    assert matrix.fmt_number(13600705.0) == "13.6M"
    assert matrix.fmt_number(40624.6) == "40.6k"
    assert matrix.fmt_number(9999.0) == "9999"
    assert matrix.fmt_number(2.5e9) == "2.5G"
    assert matrix.fmt_number(float("inf")) == "inf"


def test_headline_intervals_show_in_markdown_and_csv(tmp_path):
    from harness.results.records import Headline  # noqa: PLC0415

    run = store.new_run_dir(tmp_path)
    cells = [("cap.onnx", "onnx", {"rate": 10.0, "mode": "static"})]
    store.write_manifest(run, manifest(cells, run_id=run.name))
    headline = (
        Headline(label="p99", metric="e2e.p99", unit="ms", scale=1e3, ci="e2e.ci95.p99"),
        Headline(label="tput", metric="tput", unit="req/s", ci="tput_ci"),
    )
    metrics = {
        "e2e": {"p99": 0.0042, "ci95": {"p99": [0.0039, None]}, "adjusted": {}},
        "tput": 2378.0,
        "tput_ci": [2330.0, 2425.0],
    }
    store.write_record(
        run,
        record(
            "cap.onnx",
            run_id=run.name,
            engine="onnx",
            params=cells[0][2],
            headline=headline,
            metrics=metrics,
        ),
    )
    md, csv_path = matrix.write(run)
    text = md.read_text()
    # the data bound p99 from below only: the missing upper bound shows as "?"
    assert r"p99 4.20 \[3.90, ?\] ms" in text
    assert r"tput 2378 \[2330, 2425\] req/s" in text
    header, row = csv_path.read_text().splitlines()
    cols = dict(zip(header.split(","), row.split(","), strict=True))
    assert cols["onnx:tput ci95 low [req/s]"] == "2330.0"
    assert cols["onnx:tput ci95 high [req/s]"] == "2425.0"
    assert cols["onnx:p99 ci95 high [ms]"] == ""
