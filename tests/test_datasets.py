"""Dataset files into generative requests (workloads/lib/datasets.py): every format, every
reason an entry is rejected, the synthetic default dataset, sampling and output modes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from harness.api import Message
from workloads.lib import datasets as ds
from workloads.lib.datasets import DatasetError, Entry


def _write_json(path: Path, value: object) -> Path:
    path.write_text(json.dumps(value))
    return path


def _write_lines(path: Path, lines: list[bytes | str | object]) -> Path:
    raw = [
        line if isinstance(line, bytes) else (line if isinstance(line, str) else json.dumps(line))
        for line in lines
    ]
    path.write_bytes(b"\n".join(r if isinstance(r, bytes) else r.encode() for r in raw) + b"\n")
    return path


def _roles(entry: Entry) -> list[str]:
    return [m.role for m in entry.messages]


SHAREGPT = [
    {
        "id": "multi",
        "conversations": [
            {"from": "system", "value": "Be brief."},
            {"from": "human", "value": "first question"},
            {"from": "gpt", "value": "first answer"},
            {"from": "human", "value": "second question here"},
            {"from": "gpt", "value": "the second answer has six words"},
            {"from": "human", "value": "unanswered trailing question"},
        ],
    },
    {
        "id": "dump-keys",
        "conversations": [
            {"role": "user", "content": "hello there"},
            {"role": "assistant", "content": "hi"},
        ],
    },
    {"id": "unanswered", "conversations": [{"from": "human", "value": "anyone?"}]},
]


# -- formats ---------------------------------------------------------------------------------


def test_sharegpt_keeps_the_history_up_to_the_last_answered_human_turn(tmp_path):
    data = ds.load_dataset(_write_json(tmp_path / "sg.json", SHAREGPT))
    assert (data.format, data.total, data.rejected, data.length_unit) == (
        "sharegpt",
        3,
        {},
        "words",
    )
    multi, keys, unanswered = data.entries
    assert _roles(multi) == ["system", "user", "assistant", "user"]
    assert multi.messages[-1] == Message("user", "second question here")
    assert multi.reference_output == "the second answer has six words"
    assert multi.reference_output_tokens == 6
    assert not multi.plain
    assert multi.prompt_text == (
        "System: Be brief.\n\nUser: first question\n\nAssistant: first answer\n\n"
        "User: second question here\n\nAssistant:"
    )
    assert multi.input_tokens == len(multi.prompt_text.split())
    # role/content keys and user/assistant roles, as some dumps write them
    assert keys.messages == (Message("user", "hello there"),)
    assert (keys.reference_output, keys.reference_output_tokens) == ("hi", 1)
    assert keys.prompt_text == "hello there"
    # no gpt turn answers it: kept up to its last human turn, without a reference
    assert unanswered.messages == (Message("user", "anyone?"),)
    assert (unanswered.reference_output, unanswered.reference_output_tokens) == (None, None)
    assert len(data.sha256 or "") == 64


def test_jsonl_prompts_are_plain_with_their_output_length_and_reference(tmp_path):
    path = _write_lines(
        tmp_path / "p.jsonl",
        [
            {"prompt": "tell me a story", "output_tokens": 7},
            {"prompt": "two words", "output": "a reply of five words"},
            {"prompt": "and completion", "completion": "done"},
            {"prompt": "bare"},
        ],
    )
    data = ds.load_dataset(path)
    assert data.format == "jsonl"
    a, b, c, d = data.entries
    assert a.plain
    assert a.messages == (Message("user", "tell me a story"),)
    assert a.prompt_text == "tell me a story"
    assert (a.reference_output, a.reference_output_tokens, a.input_tokens) == (None, 7, 4)
    assert (b.reference_output, b.reference_output_tokens) == ("a reply of five words", 5)
    assert (c.reference_output, c.reference_output_tokens) == ("done", 1)
    assert (d.reference_output, d.reference_output_tokens) == (None, None)


def test_jsonl_messages_end_at_the_last_answered_user_turn_or_take_the_output_field(tmp_path):
    path = _write_lines(
        tmp_path / "m.jsonl",
        [
            {
                "messages": [
                    {"role": "user", "content": "q1"},
                    {"role": "assistant", "content": "a1"},
                ]
            },
            {
                "messages": [
                    {"role": "system", "content": "sys"},
                    {"role": "user", "content": "q"},
                ],
                "output": "given reply",
                "output_tokens": 12,
            },
        ],
    )
    first, second = ds.load_dataset(path).entries
    assert first.messages == (Message("user", "q1"),)
    assert first.reference_output == "a1"
    assert not first.plain
    assert not second.plain
    assert _roles(second) == ["system", "user"]
    assert (second.reference_output, second.reference_output_tokens) == ("given reply", 12)


def test_csv_through_datasets_with_messages_as_a_json_string(tmp_path):
    pytest.importorskip("datasets")
    messages = json.dumps([{"role": "user", "content": "from csv messages"}])
    csv = tmp_path / "d.csv"
    csv.write_text(
        "prompt,messages,output_tokens\n"
        "plain csv prompt,,9\n"
        f',"{messages.replace(chr(34), chr(34) * 2)}",\n'
    )
    data = ds.load_dataset(csv)
    assert (data.format, data.total, data.rejected) == ("csv", 2, {})
    plain, chat = data.entries
    assert plain.plain
    assert plain.prompt_text == "plain csv prompt"
    assert plain.reference_output_tokens == 9  # the gap made the column floats: 9.0 is 9
    assert not chat.plain
    assert chat.messages == (Message("user", "from csv messages"),)
    assert chat.reference_output_tokens is None


def test_parquet_through_datasets(tmp_path):
    pytest.importorskip("datasets")
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    table = pa.table(
        {
            "messages": [
                [{"role": "user", "content": "pq one"}, {"role": "assistant", "content": "r1"}],
                [{"role": "user", "content": "pq two"}],
            ],
            "output_tokens": [None, 4],
        }
    )
    pq.write_table(table, tmp_path / "d.parquet")
    data = ds.load_dataset(tmp_path / "d.parquet")
    assert data.format == "parquet"
    one, two = data.entries
    assert one.messages == (Message("user", "pq one"),)
    assert one.reference_output == "r1"
    assert (two.prompt_text, two.reference_output_tokens) == ("pq two", 4)


def test_a_plain_json_list_goes_through_datasets(tmp_path):
    pytest.importorskip("datasets")
    path = _write_json(
        tmp_path / "list.json",
        [{"prompt": "json one", "output_tokens": 3}, {"prompt": "json two", "output_tokens": 5}],
    )
    data = ds.load_dataset(path)
    assert data.format == "json"
    assert [(e.prompt_text, e.reference_output_tokens) for e in data.entries] == [
        ("json one", 3),
        ("json two", 5),
    ]


def test_without_datasets_installed_the_error_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets -> ImportError
    (tmp_path / "d.csv").write_text("prompt\nhi\n")
    with pytest.raises(DatasetError, match=r"pip install 'inference-harness\[datasets\]'"):
        ds.load_dataset(tmp_path / "d.csv")


@pytest.mark.parametrize(
    ("name", "content", "expected"),
    [
        ("a.json", json.dumps(SHAREGPT, indent=2), "sharegpt"),
        ("a.json", json.dumps([{"prompt": "x"}]), "json"),
        ("a.json", '{"prompt": "x"}\n{"prompt": "y"}\n', "jsonl"),
        ("a.json", '{\n  "data": [1]\n}\n', "json"),
        ("a.JSONL", "", "jsonl"),
        ("a.ndjson", "", "jsonl"),
        ("a.csv", "", "csv"),
        ("a.parquet", "", "parquet"),
    ],
)
def test_detect_format(tmp_path, name, content, expected):
    path = tmp_path / name
    path.write_text(content)
    assert ds.detect_format(path) == expected


def test_sharegpt_detection_survives_a_first_conversation_longer_than_the_peek(tmp_path):
    long = [{"conversations": [{"from": "human", "value": "w " * 50_000}]}]
    assert ds.detect_format(_write_json(tmp_path / "long.json", long)) == "sharegpt"


# -- rejections ------------------------------------------------------------------------------


def test_each_malformed_jsonl_entry_is_counted_under_its_reason(tmp_path):
    turn = {"role": "user", "content": "fine"}
    path = _write_lines(
        tmp_path / "bad.jsonl",
        [
            {"prompt": "the one good line"},
            '{"prompt": "unterminated',  # not valid JSON
            b'{"prompt": "caf\xe9"}',  # latin-1 bytes: not UTF-8
            "[1, 2]",  # not an object
            {"text": "no prompt field"},  # missing field
            {"messages": [{"role": "user"}]},  # missing field (content)
            {"prompt": 42},  # field of the wrong type
            {"prompt": "x", "output_tokens": -3},  # field of the wrong type
            {"prompt": "   "},  # empty turn
            {"messages": [turn, {"role": "assistant", "content": ""}]},  # empty reply
            {"messages": [{"role": "wizard", "content": "hi"}]},  # unknown role
            {"messages": [{"role": "system", "content": "only a system prompt"}]},  # no user
        ],
    )
    data = ds.load_dataset(path)
    assert [e.prompt_text for e in data.entries] == ["the one good line"]
    assert data.total == 12
    assert data.rejected == {
        "not valid JSON": 1,
        "not UTF-8": 1,
        "not an object": 1,
        "missing field": 2,
        "field of the wrong type": 2,
        "empty turn": 2,
        "unknown role": 1,
        "no user turn": 1,
    }
    assert set(data.rejected) <= set(ds.REASONS)
    assert data.total == len(data.entries) + sum(data.rejected.values())


def test_an_undecodable_sharegpt_conversation_costs_that_conversation_only(tmp_path):
    good = json.dumps(SHAREGPT[1]).encode()
    bad = b'{"conversations": [{"from": "human", "value": "\xff\xfe"}]}'
    path = tmp_path / "mixed.json"
    path.write_bytes(b"[" + good + b", " + bad + b"]")
    data = ds.load_dataset(path)
    assert data.rejected == {"not UTF-8": 1}
    assert [e.prompt_text for e in data.entries] == ["hello there"]


def test_a_prompt_longer_than_the_context_is_rejected_only_when_counted(tmp_path):
    path = _write_lines(tmp_path / "len.jsonl", [{"prompt": "short"}, {"prompt": "x" * 40}])

    def chars(text: str) -> int:  # a fake tokenizer: one token a character
        return len(text)

    counted = ds.load_dataset(path, count_tokens=chars, max_input_tokens=10)
    assert counted.rejected == {"longer than the model's context": 1}
    assert [e.prompt_text for e in counted.entries] == ["short"]
    assert counted.length_unit == "tokens"
    assert counted.entries[0].input_tokens == 5
    record = counted.to_json(used=1)
    assert record["context_checked"] is True
    assert record["max_input_tokens"] == 10

    unchecked = ds.load_dataset(path, max_input_tokens=10)  # no tokenizer: words, unchecked
    assert unchecked.rejected == {}
    assert len(unchecked.entries) == 2
    assert unchecked.length_unit == "words"
    record = unchecked.to_json(used=2)
    assert record["context_checked"] is False
    assert record["max_input_tokens"] is None
    assert record["context_check"].startswith("not checked")


def test_a_file_with_no_usable_entry_names_the_file_and_the_reasons(tmp_path):
    path = _write_lines(tmp_path / "allbad.jsonl", ["nope", "nope", {"prompt": ""}])
    with pytest.raises(DatasetError) as info:
        ds.load_dataset(path)
    message = str(info.value)
    assert str(path) in message
    assert "2 not valid JSON" in message
    assert "1 empty turn" in message


@pytest.mark.parametrize(
    ("name", "content", "fmt", "match"),
    [
        ("missing.jsonl", None, None, "does not exist"),
        ("data.txt", "hello", None, "cannot tell the format"),
        ("data.jsonl", "{}", "yaml", "unknown dataset format 'yaml'"),
        ("broken.json", '[{"conversations": [', "sharegpt", "is not valid JSON"),
        ("obj.json", '{"conversations": []}', "sharegpt", "a JSON list of conversations"),
    ],
)
def test_unreadable_files_and_unknown_formats_are_usage_errors(tmp_path, name, content, fmt, match):
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    with pytest.raises(DatasetError, match=match) as info:
        ds.load_dataset(path, fmt)
    assert name in str(info.value)
    assert isinstance(info.value, ValueError)


def test_the_record_says_what_was_read_and_used(tmp_path):
    path = _write_lines(tmp_path / "r.jsonl", [{"prompt": "a b"}, "bad", {"prompt": "c"}])
    record = ds.load_dataset(path).to_json(used=5)
    assert record["name"] == "r.jsonl"
    assert record["path"] == str(path)
    assert record["format"] == "jsonl"
    assert (record["total"], record["usable"], record["used"]) == (3, 2, 5)
    assert record["rejected"] == {"not valid JSON": 1}
    assert record["length_unit"] == "words"
    assert json.loads(json.dumps(record)) == record  # JSON as it is


# -- the default dataset ---------------------------------------------------------------------


def test_the_default_dataset_is_the_same_for_a_seed_and_differs_between_seeds():
    a, b, c = ds.default_dataset(3, n=64), ds.default_dataset(3, n=64), ds.default_dataset(4, n=64)
    assert a.entries == b.entries
    assert [e.prompt_text for e in a.entries] != [e.prompt_text for e in c.entries]
    assert (a.name, a.path, a.sha256, a.length_unit) == ("synthetic-chat", None, None, "words")
    assert a.total == 64
    assert a.rejected == {}


def test_the_default_dataset_is_multi_turn_chat_with_skewed_lengths():
    data = ds.default_dataset(0)
    assert len(data.entries) == 512
    users = np.array([_roles(e).count("user") for e in data.entries])
    assert set(users) == {1, 2, 3, 4}
    assert any(e.messages[0].role == "system" for e in data.entries)
    for entry in data.entries:
        assert not entry.plain
        assert entry.messages[-1].role == "user"
        assert entry.reference_output is not None
        assert entry.reference_output_tokens == len(entry.reference_output.split())
        # user and assistant alternate after the optional system prompt
        roles = [r for r in _roles(entry) if r != "system"]
        assert roles == ["user", "assistant"] * (len(roles) // 2) + ["user"]
    turns = [len(m.content.split()) for e in data.entries for m in e.messages if m.role == "user"]
    replies = np.array([e.reference_output_tokens for e in data.entries])
    assert 30 <= np.median(turns) <= 50
    assert max(turns) >= 200
    assert 22 <= np.median(replies) <= 38
    assert 120 <= replies.max() <= 240
    assert np.mean(replies) > np.median(replies)  # skewed right


@pytest.mark.slow  # starts a Python process: a clean sys.modules
def test_the_default_dataset_needs_neither_torch_nor_transformers():
    code = (
        "import sys; import workloads.lib.datasets as d; d.default_dataset(0, n=4);"
        "print(sorted({'torch', 'transformers'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# -- select ----------------------------------------------------------------------------------


def _numbered(n: int) -> ds.Dataset:
    """Entry i: a prompt of i + 1 words, a reference of i words (none for i = 0)."""
    entries = tuple(
        Entry(
            (Message("user", " ".join(["w"] * (i + 1))),),
            " ".join(["r"] * i) or None,
            i or None,
            plain=True,
            input_tokens=i + 1,
        )
        for i in range(n)
    )
    return ds.Dataset("n", None, None, "jsonl", entries, n, {}, "words")


def test_select_without_replacement_is_seeded_and_never_repeats():
    data = _numbered(20)
    first, again, other = (ds.select(data, 20, s) for s in (1, 1, 2))
    assert first == again
    assert first != other
    assert sorted(e.input_tokens or 0 for e in first) == list(range(1, 21))
    assert first.eligible == 20
    assert first.excluded == {}
    with pytest.raises(DatasetError, match="asked for 21 entries of n, which has 20 usable"):
        ds.select(data, 21, 1)


def test_select_with_replacement_samples_freely():
    picked = ds.select(_numbered(3), 50, 0, replace=True)
    assert len(picked) == 50
    assert {e.input_tokens for e in picked} == {1, 2, 3}


def test_select_filters_by_length_and_counts_what_they_leave_out():
    data = _numbered(10)  # inputs 1..10 words, references 0 (none)..9
    picked = ds.select(data, 4, 0, input_range=(3, 8), output_range=(3, 6))
    assert sorted(e.input_tokens or 0 for e in picked) == [4, 5, 6, 7]
    assert picked.eligible == 4
    assert picked.excluded == {
        "input length out of range": 4,  # 1, 2, 9, 10
        "reference output length out of range": 2,  # inputs 3 (ref 2) and 8 (ref 7)
    }
    no_ref = ds.select(data, 1, 0, output_range=(0, 100))
    assert no_ref.excluded == {"no reference output length": 1}
    with pytest.raises(DatasetError, match=r"has 4 usable after the length filters left out"):
        ds.select(data, 5, 0, input_range=(3, 8), output_range=(3, 6))
    with pytest.raises(DatasetError, match="not a range"):
        ds.select(data, 1, 0, input_range=(5, 2))


# -- to_requests -----------------------------------------------------------------------------


def _pair() -> list[Entry]:
    chat = Entry(
        (Message("user", "q"), Message("assistant", "a"), Message("user", "q2")), "r", 17, False
    )
    plain = Entry((Message("user", "plain prompt"),), None, None, True)
    return [chat, plain]


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("fixed", [(32, True), (32, True)]),
        ("reference", [(17, True), (32, True)]),  # no reference: fixed_output
        ("natural", [(128, False), (128, False)]),
    ],
)
def test_each_output_mode_sets_max_tokens_and_ignore_eos(mode, expected):
    requests = ds.to_requests(_pair(), mode, seed=7)
    assert [(r.max_tokens, r.ignore_eos) for r in requests] == expected
    assert [r.kind for r in requests] == ["chat", "text"]
    assert [r.request_id for r in requests] == ["d7-0", "d7-1"]
    assert requests[0].messages == _pair()[0].messages
    assert requests[0].prompt == ""
    assert requests[1].prompt == "plain prompt"
    assert requests[1].messages == ()


def test_to_requests_forces_chat_or_text_and_takes_its_sizes():
    chat, plain = _pair()
    as_text = ds.to_requests([chat], "natural", seed=0, cap=9, chat=False, id_prefix="x")
    assert as_text[0].kind == "text"
    assert as_text[0].prompt == chat.prompt_text
    assert (as_text[0].max_tokens, as_text[0].request_id) == (9, "x0-0")
    as_chat = ds.to_requests([plain], "fixed", seed=0, fixed_output=5, chat=True)
    assert as_chat[0].kind == "chat"
    assert as_chat[0].messages == plain.messages
    assert as_chat[0].max_tokens == 5
    assert ds.without_reference(_pair()) == 1
    with pytest.raises(DatasetError, match="unknown output mode"):
        ds.to_requests([chat], "longest", seed=0)  # type: ignore[arg-type]


def test_the_default_dataset_makes_unique_chat_requests_of_its_reference_lengths():
    data = ds.default_dataset(1, n=32)
    picked = ds.select(data, 32, 1)
    requests = ds.to_requests(picked, "reference", seed=1)
    assert len({r.request_id for r in requests}) == 32
    assert all(r.kind == "chat" and r.ignore_eos for r in requests)
    assert [r.max_tokens for r in requests] == [e.reference_output_tokens for e in picked]
