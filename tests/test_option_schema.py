"""The declarative option schema: types, bounds, choices, custom parsers, the unknown-option
message, defaults and the help table; and every registered adapter's own schema."""

import pytest

from harness.engine import registry
from harness.engine.optionschema import (
    NO_DEFAULT,
    Kind,
    Option,
    OptionSchema,
    choice,
    custom,
    flag,
    integer,
    markdown_table,
    number,
    schema_of,
    text,
)


def _pair(value: str) -> tuple[str, str]:
    left, sep, right = value.partition("=")
    if not sep or not left:
        raise ValueError(f"pair {value!r}: expected NAME=VALUE")
    return left, right


SCHEMA = OptionSchema(
    integer("threads", "worker threads", default="4"),
    integer("level", "optimization level", default="3", low=0, high=5),
    integer("seed", "sampling seed", default="0", low=0),
    number("share", "share of memory", default="0.9", low=0, high=1, exclusive=True),
    number("wait_s", "seconds to wait", default="0", low=0),
    flag("cuda_graph", "capture a CUDA graph"),
    choice("dtype", "compute dtype", ("float32", "float16", "bfloat16"), default="float32"),
    choice("api", "which API", ("completions", "chat"), default="completions"),
    text("cache_dir", "where caches go (default: $HOME/.cache)"),
    custom("pair", "a NAME=VALUE pair", _pair, "NAME=VALUE"),
)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"threads": "0"}, r"^threads must be a positive integer, got '0'$"),
        ({"threads": "two"}, "threads must be a positive integer, got 'two'"),
        ({"threads": "1.5"}, "threads must be a positive integer"),
        ({"level": "6"}, r"^level must be an integer in \[0, 5\], got '6'$"),
        ({"level": "-1"}, r"level must be an integer in \[0, 5\]"),
        ({"seed": "-1"}, "seed must be an integer >= 0"),
        ({"share": "1"}, r"^share must be a number in \(0, 1\), got '1'$"),
        ({"share": "0"}, r"share must be a number in \(0, 1\)"),
        ({"share": "half"}, r"share must be a number in \(0, 1\)"),
        ({"share": "nan"}, r"share must be a number in \(0, 1\)"),
        ({"wait_s": "-0.5"}, "wait_s must be a number >= 0"),
        ({"wait_s": "inf"}, "wait_s must be a number >= 0"),
        ({"cuda_graph": "yes"}, r"^cuda_graph must be 0 or 1, got 'yes'$"),
        ({"dtype": "int4"}, "dtype must be one of float32, float16, bfloat16, got 'int4'"),
        ({"api": "embeddings"}, "api must be completions or chat, got 'embeddings'"),
        ({"pair": "novalue"}, r"pair 'novalue': expected NAME=VALUE"),
    ],
)
def test_values_outside_the_declared_type_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        SCHEMA.validate(options)


def test_values_of_the_declared_type_pass():
    SCHEMA.validate(
        {
            "threads": "16",
            "level": "0",
            "seed": "0",
            "share": "0.5",
            "wait_s": "0",
            "cuda_graph": "1",
            "dtype": "bfloat16",
            "api": "chat",
            "cache_dir": "/tmp/anything goes",
            "pair": "a=b",
        }
    )
    SCHEMA.validate({})


def test_an_unknown_option_is_named_with_every_known_one():
    with pytest.raises(ValueError, match="unknown option") as caught:
        SCHEMA.validate({"threds": "4", "zz": "1", "threads": "0"})
    message = str(caught.value)
    assert message.startswith("unknown option(s) threds, zz; known: threads: worker threads")
    for name in SCHEMA:
        assert f"{name}: " in message
    assert "level: optimization level (an integer in [0, 5]; default 3)" in message


def test_defaults_and_resolve_fill_in_only_declared_defaults():
    defaults = SCHEMA.defaults()
    assert defaults["threads"] == "4"
    assert defaults["cuda_graph"] == "0"  # a flag is off unless declared otherwise
    assert "cache_dir" not in defaults
    assert "pair" not in defaults
    assert SCHEMA.resolve({"threads": "8"})["threads"] == "8"
    assert SCHEMA.resolve({"threads": "8"})["level"] == "3"
    SCHEMA.validate(defaults)


def test_the_schema_reads_as_a_name_to_summary_mapping():
    assert list(SCHEMA) == [o.name for o in SCHEMA.options]
    assert len(SCHEMA) == 10
    assert "threads" in SCHEMA
    assert SCHEMA["dtype"] == ("compute dtype (one of float32, float16, bfloat16; default float32)")
    assert SCHEMA["cache_dir"] == "where caches go (default: $HOME/.cache) (a string)"
    assert SCHEMA.option("share").kind is Kind.FLOAT


def test_help_rows_and_the_markdown_table():
    rows = {row.name: row for row in SCHEMA.help_rows()}
    assert rows["level"].values == "an integer in [0, 5]"
    assert rows["level"].default == "3"
    assert rows["cache_dir"].default == NO_DEFAULT
    assert rows["pair"].values == "NAME=VALUE"
    table = markdown_table(SCHEMA).splitlines()
    assert table[0] == "| option | values | default | description |"
    assert table[1] == "| --- | --- | --- | --- |"
    assert "| `share` | a number in (0, 1) | `0.9` | share of memory |" in table
    assert "| `cache_dir` | a string | - | where caches go (default: $HOME/.cache) |" in table
    assert len(table) == 2 + len(SCHEMA)


def test_a_pipe_in_help_does_not_break_the_markdown_row():
    schema = OptionSchema(choice("mode", "eager | compile", ("eager", "compile")))
    assert r"eager \| compile" in markdown_table(schema)


def test_declarations_are_checked():
    with pytest.raises(ValueError, match="unique"):
        OptionSchema(flag("a", "x"), flag("a", "y"))
    with pytest.raises(ValueError, match="needs a parser"):
        Option("p", Kind.CUSTOM, "no parser")
    with pytest.raises(ValueError, match="needs choices"):
        choice("c", "nothing to choose", ())


def test_a_must_phrase_overrides_the_derived_one():
    schema = OptionSchema(number("t", "timeout", low=0, exclusive=True, must="a positive number"))
    with pytest.raises(ValueError, match=r"^t must be a positive number, got '-1'$"):
        schema.validate({"t": "-1"})
    assert schema.help_rows()[0].values == "a positive number"


# -- every registered adapter ------------------------------------------------------------------


def _schemas():
    for name in registry.names():
        schema = schema_of(registry.load(name))
        if schema is not None:
            yield name, schema


def test_every_builtin_adapter_declares_a_schema():
    declared = {name for name, _ in _schemas()}
    builtins = {"onnxruntime", "torch", "tensorrt", "vllm", "openai", "null", "null-gen"}
    assert builtins | {"tensorrt-llm", "lmdeploy"} <= declared


@pytest.mark.parametrize(("name", "schema"), list(_schemas()), ids=lambda v: str(v)[:20])
def test_each_adapter_accepts_its_defaults_and_names_an_unknown_option(name, schema):
    factory = registry.load(name)
    defaults = schema.defaults()
    schema.validate(defaults)
    factory.validate_options(defaults)
    with pytest.raises(ValueError, match="no_such_option"):
        factory.validate_options({"no_such_option": "1"})
    for row in schema.help_rows():
        assert row.help, f"{name}.{row.name} has no help"
        assert row.values, f"{name}.{row.name} does not say what it takes"
