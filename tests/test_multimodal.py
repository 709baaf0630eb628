"""Multimodal requests without an engine: the image spec and its synthetic images, the
user's image files and data URLs in datasets, the OpenAI chat payload (against a
loopback test double of a server), vLLM's in-process prompt, and the workload's record
fields."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiohttp import web

from engines import vllm_media, vllm_server
from engines.openai_http import OpenAIEngine, RequestFailed
from engines.openai_media import chat_messages
from engines.vllm import VllmEngine
from harness.engine import EngineConfig, GenerationRequest, Message, registry
from harness.engine.media import ImageInput
from harness.exceptions import UsageError
from tests.support.fault_server import serve_app
from workloads.lib import datasets
from workloads.lib.mmimages import (
    ImageReadError,
    ImageSpecError,
    image_size,
    parse_image_spec,
    png_bytes,
    read_data_url,
    read_image_file,
    request_samples,
    synthetic_images,
)
from workloads.test_multimodal import image_account, image_requests

PIL = pytest.importorskip("PIL.Image")


def png(width: int = 8, height: int = 6, seed: int = 0) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (height, width, 3), dtype=np.uint8)
    return png_bytes(pixels)


def image(width: int = 8, height: int = 6) -> ImageInput:
    return ImageInput(png(width, height), "image/png", width, height, "test")


# -- the spec and the synthetic images -------------------------------------------------------


def test_a_spec_declares_counts_sizes_and_format():
    spec = parse_image_spec("count=1-3,size=224x224|448x336,format=jpeg")
    assert spec.counts == (1, 2, 3)
    assert spec.sizes == ((224, 224), (448, 336))
    assert spec.format == "jpeg"
    assert parse_image_spec("size=64x32").counts == (1,)
    assert parse_image_spec("count=0|2,size=8x8").counts == (0, 2)
    assert str(parse_image_spec("count=2,size=8x8")) == "count=2,size=8x8,format=png"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("count=1", "size=WxH is required"),
        ("count=1,size=224", "size '224' is not WxH"),
        ("count=3-1,size=8x8", "count=3-1 is not N, LO-HI"),
        ("count=1,size=8x8,colour=red", "'colour=red' is not count="),
        ("size=8x8,format=gif", "format 'gif' is not one of"),
        ("size=0x8", "must be 1..8192 a side"),
        ("count=65,size=8x8", "must be 0..64"),
    ],
)
def test_a_bad_spec_is_a_usage_error_naming_the_part(text: str, message: str):
    with pytest.raises(ImageSpecError, match=message) as caught:
        parse_image_spec(text)
    assert isinstance(caught.value, UsageError)


def test_synthetic_images_are_deterministic_and_follow_the_distribution():
    spec = parse_image_spec("count=0-2,size=16x8|24x24")
    first, again = synthetic_images(spec, 200, 5), synthetic_images(spec, 200, 5)
    assert [[i.data for i in r] for r in first] == [[i.data for i in r] for r in again]
    other = synthetic_images(spec, 1, 6)[0]
    assert [i.data for i in other] != [i.data for i in first[0]] or not other
    counts = np.bincount([len(r) for r in first], minlength=3)
    assert counts.sum() == 200
    assert all(40 < c < 100 for c in counts), counts  # uniform over 0, 1, 2
    sizes = {(i.width, i.height) for r in first for i in r}
    assert sizes == {(16, 8), (24, 24)}
    for img in (i for r in first[:20] for i in r):
        with PIL.open(io.BytesIO(img.data)) as opened:
            assert opened.size == (img.width, img.height)
        assert image_size(img.data, "image/png") == (img.width, img.height)


def test_every_synthetic_image_is_distinct_and_jpeg_is_jpeg():
    spec = parse_image_spec("count=2,size=32x32,format=jpeg")
    images = [i for r in synthetic_images(spec, 5, 0) for i in r]
    assert len({i.data for i in images}) == 10  # no engine image cache can hit
    assert {i.mime for i in images} == {"image/jpeg"}
    assert image_size(images[0].data, "image/jpeg") == (32, 32)


# -- the user's images -----------------------------------------------------------------------


def test_image_files_and_data_urls_are_read_and_checked(tmp_path: Path):
    (tmp_path / "a.png").write_bytes(png(10, 7))
    got = read_image_file(tmp_path / "a.png")
    assert (got.width, got.height, got.mime) == (10, 7, "image/png")
    url = "data:image/png;base64," + base64.b64encode(png(3, 4)).decode()
    assert (read_data_url(url, "row 1").width, read_data_url(url, "row 1").height) == (3, 4)
    (tmp_path / "bad.png").write_bytes(b"not a png at all, not at all")
    with pytest.raises(ImageReadError, match=r"bad.png cannot be used: not a PNG file"):
        read_image_file(tmp_path / "bad.png")
    with pytest.raises(ImageReadError, match=r"suffix .gif is not one of"):
        read_image_file(tmp_path / "a.gif")
    with pytest.raises(ImageReadError, match=r"data URL in row 2 is not valid base64"):
        read_data_url("data:image/png;base64,@@@", "row 2")
    with pytest.raises(ImageReadError, match=r"is not data:image/png\|jpeg\|webp;base64"):
        read_data_url("data:text/plain;base64,aGk=", "row 3")


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_a_dataset_carries_its_rows_images_to_the_requests(tmp_path: Path):
    (tmp_path / "pics").mkdir()
    (tmp_path / "pics" / "cat.png").write_bytes(png(12, 9))
    url = "data:image/png;base64," + base64.b64encode(png(5, 5)).decode()
    rows = [
        {
            "conversations": [{"from": "human", "value": "<image>\nWhat is it?"}],
            "image": "pics/cat.png",
        },
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": url}},
                        {"type": "text", "text": "And this?"},
                    ],
                }
            ]
        },
        {"prompt": "no image here"},
    ]
    data = datasets.load_dataset(write_jsonl(tmp_path / "d.jsonl", rows))
    first, second, third = data.entries
    assert first.messages == (Message("user", "What is it?"),)  # the marker is dropped
    assert [(i.width, i.height) for i in first.images] == [(12, 9)]
    assert second.messages == (Message("user", "And this?"),)
    assert [(i.width, i.height) for i in second.images] == [(5, 5)]
    assert third.images == ()
    reqs = datasets.to_requests(data.entries, "fixed", seed=0, fixed_output=4)
    assert [len(r.images) for r in reqs] == [1, 1, 0]
    assert reqs[0].kind == "chat"
    assert reqs[2].kind == "text"  # a plain prompt without images stays text


@pytest.mark.parametrize(
    ("row", "message"),
    [
        (
            {"prompt": "x", "image": "missing.png"},
            r"d.jsonl line 2: image file .*missing.png does not exist",
        ),
        (
            {"prompt": "x", "image": "https://x.org/a.png"},
            r"line 2: image https://x.org/a.png is remote",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "input_audio"}]}]},
            r"line 2: content part input_audio is not sent .*audio and video are not supported",
        ),
        ({"prompt": "x", "images": [3]}, r"line 2: image/images must be a path or a list"),
    ],
)
def test_a_bad_image_reference_is_a_usage_error_naming_file_and_line(
    tmp_path: Path, row: dict, message: str
):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "fine"}, row])
    with pytest.raises(UsageError, match=message):
        datasets.load_dataset(path)


# -- the OpenAI chat payload -----------------------------------------------------------------


def test_images_become_image_url_parts_of_the_last_user_turn():
    messages = (
        Message("system", "s"),
        Message("user", "u1"),
        Message("assistant", "a"),
        Message("user", "look"),
    )
    one, two = image(4, 4), image(6, 2)
    body = chat_messages(messages, (one, two))
    assert body[:3] == [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u1"},
        {"role": "assistant", "content": "a"},
    ]
    assert body[3] == {
        "role": "user",
        "content": [
            {"type": "image_url", "image_url": {"url": one.data_url()}},
            {"type": "image_url", "image_url": {"url": two.data_url()}},
            {"type": "text", "text": "look"},
        ],
    }
    # without images, the payload is what it was before images existed
    assert chat_messages(messages, ()) == [{"role": m.role, "content": m.content} for m in messages]


def loopback_test_double(seen: list[dict], status: int = 200):
    """A TEST DOUBLE of an OpenAI-compatible server (not a real engine): records each chat
    body and answers with a two-token stream, or with ``status`` and an error."""

    async def chat(request: web.Request) -> web.Response:
        seen.append(await request.json())
        if status != 200:
            error = {"error": {"message": "this model does not take images"}}
            return web.json_response(error, status=status)
        events = [
            {
                "choices": [{"index": 0, "delta": {"content": "hi"}}],
                "usage": {"prompt_tokens": 20, "completion_tokens": 1},
            },
            {
                "choices": [{"index": 0, "delta": {"content": "!"}, "finish_reason": "length"}],
                "usage": {"prompt_tokens": 20, "completion_tokens": 2},
            },
        ]
        body = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
        return web.Response(body=body.encode(), content_type="text/event-stream")

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "vlm"}]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    return app


async def collect(engine: OpenAIEngine, request: GenerationRequest) -> list:
    return [c async for c in engine.generate(request)]


@pytest.mark.parametrize("status", [200, 400])
def test_the_http_engine_sends_data_urls_and_says_why_a_server_refused(status: int):
    seen: list[dict] = []
    picture = image(9, 3)
    request = GenerationRequest("", 2, messages=(Message("user", "what?"),), images=(picture,))
    with serve_app(loopback_test_double(seen, status)) as url:
        engine = OpenAIEngine(EngineConfig(model=Path("m"), options={"base_url": url}))
        engine.load()
        try:
            if status == 200:
                chunks = asyncio.run(collect(engine, request))
                assert sum(c.n_tokens for c in chunks) == 2
            else:
                with pytest.raises(RequestFailed, match=r"HTTP 400: .*does not take images"):
                    asyncio.run(collect(engine, request))
        finally:
            engine.close()
    (body,) = seen
    parts = body["messages"][0]["content"]
    sent = parts[0]["image_url"]["url"]
    assert base64.b64decode(sent.split(",", 1)[1]) == picture.data  # the bytes, not re-encoded
    assert parts[1] == {"type": "text", "text": "what?"}


def test_engines_declare_image_input_and_others_do_not():
    assert "image" in VllmEngine.capabilities.modalities
    assert "image" in OpenAIEngine.capabilities.modalities
    null = registry.load("null-gen").capabilities
    assert null.missing({"modalities": "image"}) == ["modalities=image"]


# -- vLLM in process -------------------------------------------------------------------------


class FakeTemplateTokenizer:
    """A FAKE tokenizer: renders image parts as ``<image>``, one id per character."""

    def get_chat_template(self):
        return "fake"

    def apply_chat_template(self, chat, add_generation_prompt, tokenize):
        assert add_generation_prompt
        assert not tokenize
        out = []
        for m in chat:
            content = m["content"]
            if not isinstance(content, str):
                content = "".join("<image>" if p["type"] == "image" else p["text"] for p in content)
            out.append(f"{m['role']}: {content}\n")
        return "".join(out) + "assistant:"

    def encode(self, text, add_special_tokens):
        assert not add_special_tokens  # the template writes any BOS
        return [ord(c) for c in text]


def test_the_in_process_prompt_is_the_template_with_image_parts_and_decoded_images():
    request = GenerationRequest(
        "", 2, messages=(Message("user", "hi"),), images=(image(8, 6), image(4, 2))
    )
    prompt = asyncio.run(vllm_media.prompt(FakeTemplateTokenizer(), request, "m"))
    text = "".join(chr(i) for i in prompt["prompt_token_ids"])
    assert text == "user: <image><image>hi\nassistant:"
    decoded = prompt["multi_modal_data"]["image"]
    assert [(d.mode, d.size) for d in decoded] == [("RGB", (8, 6)), ("RGB", (4, 2))]


def test_model_impl_reaches_the_engine_and_the_server():
    engine = VllmEngine(EngineConfig(model=Path("m"), options={"model_impl": "transformers"}))
    assert engine.engine_args()["model_impl"] == "transformers"
    assert "model_impl" not in VllmEngine(EngineConfig(model=Path("m"))).engine_args()
    argv = vllm_server.command(Path("m"), 1, settings={"model_impl": "transformers"})
    assert argv[argv.index("--model-impl") + 1] == "transformers"
    assert "--model-impl" not in vllm_server.command(Path("m"), 1)
    with pytest.raises(ValueError, match="model_impl"):
        VllmEngine.validate_options({"model_impl": "tensorrt"})


# -- the workload's requests and record ------------------------------------------------------


def test_the_workloads_requests_and_record_fields():
    spec = parse_image_spec("count=1-2,size=16x16|32x8")
    reqs = image_requests(spec, 30, 1)
    assert [r.request_id for r in reqs] == [f"mm1-{i}" for i in range(30)]
    assert all(r.kind == "chat" and 1 <= len(r.images) <= 2 for r in reqs)
    assert [r.images for r in reqs] == [r.images for r in image_requests(spec, 30, 1)]
    samples = request_samples([r.images for r in reqs])
    assert samples["image_count"] == [float(len(r.images)) for r in reqs]
    assert samples["image_pixels"] == [float(sum(i.pixels for i in r.images)) for r in reqs]

    class Done:  # the two latencies image_account reads of a request record
        def __init__(self, ttft: float, e2e: float) -> None:
            self.ttft, self.t_last, self.t_sched = ttft, e2e, 0.0

    ok = [(r, Done(0.1 * len(r.images), 1.0)) for r in reqs]
    account = image_account(spec, ok)  # type: ignore[arg-type]
    assert account["spec"] == {"counts": [1, 2], "sizes": ["16x16", "32x8"], "format": "png"}
    assert set(account["by_count"]) == {"1", "2"}
    assert account["by_count"]["2"]["ttft_p50_s"] == pytest.approx(0.2)
    assert sum(v["requests"] for v in account["by_count"].values()) == 30
    assert account["ttft_split"] is None


def test_the_harness_started_server_serves_the_model_the_cell_opens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Servers (workloads/conftest.py), with its server start replaced by a FAKE that
    records the model: a cell on the VLM gets a server of its own, one on the same
    model reuses it."""
    from workloads.conftest import Servers  # noqa: PLC0415

    served: list[Path] = []

    @contextlib.contextmanager
    def fake_server(self, kind, prefix_caching, chosen, log, *, cpus, model):
        served.append(model)
        yield types.SimpleNamespace(base_url=f"http://127.0.0.1:{len(served)}")

    monkeypatch.setattr(Servers, "_server", fake_server)
    servers = Servers(types.SimpleNamespace(model=tmp_path / "text"), tmp_path)  # type: ignore[arg-type]
    try:
        text, started = servers.endpoint(model=tmp_path / "text")
        assert started
        vlm, started = servers.endpoint(model=tmp_path / "vlm")
        assert started
        again, started = servers.endpoint(model=tmp_path / "vlm")
        assert not started
        assert again.base_url == vlm.base_url != text.base_url
        assert served == [tmp_path / "text", tmp_path / "vlm"]
    finally:
        servers.close()
