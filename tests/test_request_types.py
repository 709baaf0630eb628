"""The request types an engine is handed check themselves when built: images on a chat
request, a LoRA adapter's name, pooling requests and results, and the capabilities that
declare them."""

from __future__ import annotations

import base64

import pytest

from harness.engine import (
    Capabilities,
    Family,
    GenerationRequest,
    ImageInput,
    Message,
    PoolingRequest,
    PoolingResult,
)

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 16


def _image(**kw: object) -> ImageInput:
    fields: dict[str, object] = {"data": PNG, "mime": "image/png", "width": 4, "height": 3}
    fields.update(kw)
    return ImageInput(**fields)  # type: ignore[arg-type]


def test_an_image_counts_its_pixels_and_inlines_itself_as_a_data_url():
    image = _image()
    assert image.pixels == 12
    head, encoded = image.data_url().split(",", 1)
    assert head == "data:image/png;base64"
    assert base64.b64decode(encoded) == PNG


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"mime": "image/gif"}, "image mime 'image/gif'"),
        ({"width": 0}, "image size 0x3"),
        ({"data": b"", "source": "cat.png"}, "image 'cat.png' has no bytes"),
    ],
)
def test_a_bad_image_is_refused_naming_what_is_wrong(fields: dict[str, object], message: str):
    with pytest.raises(ValueError, match=message):
        _image(**fields)


def test_images_ride_on_a_chat_request_and_an_adapter_on_any():
    chat = GenerationRequest(
        prompt="", max_tokens=4, messages=(Message("user", "what is this?"),), images=(_image(),)
    )
    assert chat.kind == "chat"
    assert chat.images[0].pixels == 12
    assert GenerationRequest(prompt="hi", max_tokens=2, lora="sql").lora == "sql"
    with pytest.raises(ValueError, match="a request with images is a chat request"):
        GenerationRequest(prompt="hi", max_tokens=2, images=(_image(),))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"inputs": ()}, "at least one input"),
        ({"inputs": ("a", "")}, "a pooling input is empty"),
        ({"inputs": ("a",), "kind": "score"}, "score and rerank requests need a query"),
        ({"inputs": ("a",), "query": "q"}, "embed requests take none"),
        ({"inputs": ("a",), "kind": "classify"}, "pooling kind 'classify'"),
    ],
)
def test_a_bad_pooling_request_is_refused(fields: dict[str, object], message: str):
    with pytest.raises(ValueError, match=message):
        PoolingRequest(**fields)  # type: ignore[arg-type]


def test_pooling_requests_and_results_that_hold_together():
    rerank = PoolingRequest(inputs=("doc one", (1, 2, 3)), kind="rerank", query="which?")
    assert len(rerank.inputs) == 2
    assert PoolingResult(n_outputs=2, scores=(0.5, 0.1), prompt_tokens=9).scores == (0.5, 0.1)
    with pytest.raises(ValueError, match="one score per output"):
        PoolingResult(n_outputs=2, scores=(0.5,))


def test_capabilities_declare_media_adapters_and_pooling_only_where_they_fit():
    generative = Capabilities(
        Family.GENERATIVE,
        frozenset({"cpu"}),
        modalities=frozenset({"image"}),
        lora=True,
        pooling=frozenset({"embed", "score"}),
    )
    assert generative.missing({"lora": True, "modalities": "image", "pooling": "embed"}) == []
    assert generative.missing({"pooling": "rerank"}) == ["pooling=rerank"]
    with pytest.raises(ValueError, match="only generative engines declare lora"):
        Capabilities(Family.TENSOR, frozenset({"cpu"}), lora=True)
    with pytest.raises(ValueError, match="pooling kinds"):
        Capabilities(Family.GENERATIVE, frozenset({"cpu"}), pooling=frozenset({"classify"}))
