"""The official `openai` client against the simulator (or a live SGLang, given a URL).

What users of the OpenAI-compatible endpoints run: if the client parses the simulator's
answers, streams and errors, code written against the simulator works against SGLang.

    EXPANSION_CONTRACT_URL=http://127.0.0.1:30000 pytest tests/contract/test_openai_client.py

runs it against a live server with a tokenizer.
"""

from __future__ import annotations

import os

import openai
import pytest

LIVE_URL = os.environ.get("EXPANSION_CONTRACT_URL")
LENGTH = {"ignore_eos": True}  # SGLang's extension: run to max_tokens


@pytest.fixture(scope="module")
def client(request: pytest.FixtureRequest) -> openai.OpenAI:
    if os.environ.get("EXPANSION_CONTRACT_TOKENIZED") == "1":
        pytest.skip("the OpenAI endpoints need a tokenizer")
    url = LIVE_URL or request.getfixturevalue("sim_url")
    return openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)


@pytest.fixture(scope="module")
def model(client: openai.OpenAI) -> str:
    return client.models.list().data[0].id


def test_completion(client: openai.OpenAI, model: str) -> None:
    out = client.completions.create(model=model, prompt="Explain mamba.", max_tokens=8,
                                    extra_body=LENGTH)
    assert out.object == "text_completion" and isinstance(out.choices[0].text, str)
    assert out.choices[0].finish_reason == "length"
    assert out.usage is not None and out.usage.completion_tokens == 8


def test_n_samples(client: openai.OpenAI, model: str) -> None:
    out = client.completions.create(model=model, prompt="Hello", max_tokens=6, n=3,
                                    extra_body=LENGTH)
    assert [c.index for c in out.choices] == [0, 1, 2]
    assert out.usage is not None and out.usage.completion_tokens == 18


def test_a_list_of_prompts_and_token_ids(client: openai.OpenAI, model: str) -> None:
    out = client.completions.create(model=model, prompt=["first", "second"], max_tokens=4,
                                    n=2, extra_body=LENGTH)
    assert [c.index for c in out.choices] == [0, 1, 2, 3]  # prompt-major, as OpenAI orders
    assert out.usage is not None and out.usage.completion_tokens == 16
    ids = client.completions.create(model=model, prompt=[11, 12, 13], max_tokens=4,
                                    extra_body=LENGTH)
    assert ids.usage is not None and ids.usage.prompt_tokens == 3


def test_chat(client: openai.OpenAI, model: str) -> None:
    out = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=8,
        extra_body=LENGTH)
    assert out.choices[0].message.role == "assistant"
    assert isinstance(out.choices[0].message.content, str)
    assert out.usage is not None and out.usage.completion_tokens == 8


def test_streamed_completion(client: openai.OpenAI, model: str) -> None:
    chunks = list(client.completions.create(model=model, prompt="Hi", max_tokens=5,
                                            stream=True, extra_body=LENGTH))
    assert len(chunks) == 5 and chunks[-1].choices[0].finish_reason == "length"
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])
    assert "".join(c.choices[0].text for c in chunks)


def test_streamed_chat_with_usage(client: openai.OpenAI, model: str) -> None:
    chunks = list(client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True,
        stream_options={"include_usage": True}, extra_body=LENGTH))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4


def test_what_the_server_refuses_is_a_bad_request(client: openai.OpenAI, model: str) -> None:
    if LIVE_URL:
        pytest.skip("real SGLang honours these fields")
    with pytest.raises(openai.BadRequestError, match="logit_bias"):
        client.completions.create(model=model, prompt="Hi", max_tokens=4,
                                  logit_bias={"5": 1})
