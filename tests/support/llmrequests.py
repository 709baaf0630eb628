"""Requests as users send them to an in-process LLM engine (the embedded tiny Llama): a
text prompt the engine tokenizes, a chat conversation it renders with the model's chat
template, and a reply that ends where the model ends it. vLLM and transformers run the
same check (``takes_text_chat_and_natural_end``) on their conformance suites' engines."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from harness.engine import GenerationRequest, GenerativeEngine, Message
from harness.load.clock import MonotonicClock
from harness.load.streamdriver import Driver
from harness.metrics.streamtiming import RequestRecord

CONVERSATION = (
    Message("system", "Answer in one word."),
    Message("user", "Bada kefi lomo zuri?"),
)


def chat_template_ids(model: Path) -> list[int]:
    """CONVERSATION's prompt ids as the embedded tokenizer's chat template gives them."""
    from transformers import AutoTokenizer  # noqa: PLC0415

    tokenizer = AutoTokenizer.from_pretrained(str(model))
    messages = [{"role": m.role, "content": m.content} for m in CONVERSATION]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert text.startswith("<s>system: Answer in one word.\nuser: Bada kefi lomo zuri?\n")
    assert text.endswith("assistant:")
    assert ids.count(tokenizer.bos_token_id) == 1
    assert ids[0] == tokenizer.bos_token_id
    return list(ids)


def prompt_ending_at_eos(model: Path, *, as_text: bool = False) -> tuple[int, ...]:
    """A one- or two-token prompt whose greedy next token is the EOS, by the widest margin
    found (the random-weight model rarely ends a reply by itself): a natural-EOS request
    with it must stop after one token, where ignore_eos goes on to max_tokens.
    ``as_text``: only prompts whose text tokenizes back to the same ids (for a server
    that takes text prompts only)."""
    import torch  # noqa: PLC0415
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: PLC0415

    lm = AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.float32).eval()
    eos = int(lm.config.eos_token_id)
    gen = torch.Generator().manual_seed(0)
    candidates = [
        torch.arange(4, lm.config.vocab_size).unsqueeze(1),
        torch.randint(4, lm.config.vocab_size, (8000, 2), generator=gen),
    ]
    if as_text:
        tokenizer = AutoTokenizer.from_pretrained(str(model))
        candidates = [c[_round_trips(tokenizer, c)] for c in candidates]
    best: tuple[float, tuple[int, ...]] = (0.0, ())
    with torch.no_grad():
        for ids in candidates:
            logits = lm(input_ids=ids).logits[:, -1, :]
            top = logits.topk(2, dim=-1)
            margin = torch.where(top.indices[:, 0] == eos, top.values[:, 0] - top.values[:, 1], 0)
            i = int(margin.argmax())
            if float(margin[i]) > best[0]:
                best = (float(margin[i]), tuple(int(t) for t in ids[i]))
    assert best[1], "no prompt found whose greedy next token is the EOS"
    return best[1]


def _round_trips(tokenizer: Any, rows: Any) -> list[bool]:
    return [tokenizer.encode(tokenizer.decode(r.tolist())) == r.tolist() for r in rows]


def takes_text_chat_and_natural_end(
    engine: GenerativeEngine, model: Path, run: Callable[[Coroutine[Any, Any, Any]], Any]
) -> None:
    """A few short requests of each kind through the load driver, on a loaded ``engine``
    that keeps its tokenizer as ``_tokenizer`` (set back afterwards); ``run`` runs a
    coroutine on the loop the engine is bound to."""
    from transformers import AutoTokenizer  # noqa: PLC0415

    tokenizer = AutoTokenizer.from_pretrained(str(model))
    chat_ids = chat_template_ids(model)
    eos_prompt = prompt_ending_at_eos(model)
    text_prompt = "Bada kefi lomo zuri."
    requests = {
        "text": GenerationRequest(text_prompt, 4, request_id="text"),
        "chat": GenerationRequest("", 4, request_id="chat", messages=CONVERSATION),
        "natural": GenerationRequest(eos_prompt, 8, ignore_eos=False, request_id="natural"),
        "fixed": GenerationRequest(eos_prompt, 8, request_id="fixed"),
    }
    driver = Driver(engine, MonotonicClock(), 120.0)
    own = engine._tokenizer  # type: ignore[attr-defined]

    async def send() -> tuple[dict[str, RequestRecord], RequestRecord]:
        done = {name: await driver.one(req, 0.0) for name, req in requests.items()}
        # a model without a chat template: the chat request fails, saying so
        untemplated = AutoTokenizer.from_pretrained(str(model))
        untemplated.chat_template = None
        engine._tokenizer = untemplated  # type: ignore[attr-defined]
        try:
            return done, await driver.one(requests["chat"], 0.0)
        finally:
            engine._tokenizer = own  # type: ignore[attr-defined]

    records, untemplated = run(send())
    print({name: (r.n_in, r.n_out, r.error) for name, r in records.items()}, eos_prompt)
    for name, rec in records.items():
        assert rec.error is None, (name, rec.error)
        assert rec.n_in_source == "engine", name  # prompt_tokens from the engine
    text, chat, natural, fixed = (records[k] for k in ("text", "chat", "natural", "fixed"))
    assert text.n_in == len(tokenizer.encode(text_prompt)) > 0  # the engine tokenized the text
    assert text.n_out == 4
    assert chat.n_in == len(chat_ids)  # rendered with the template, one BOS
    assert chat.n_out == 4
    assert natural.n_in == fixed.n_in == len(eos_prompt)
    assert natural.n_out == 1  # ended where the model ended it: at its EOS
    assert natural.n_asked == 8
    assert fixed.n_out == 8  # the same prompt with ignore_eos: exactly what was asked
    assert untemplated.error is not None
    assert untemplated.error.startswith("NoChatTemplate: ")
    assert "has no chat template" in untemplated.error
