"""Capture a tokenizer model's answers (OpenAI and native endpoints) as fixtures.

Device side, standard library + httpx. Usage: capture_answers.py URL MODEL OUT.json
"""

from __future__ import annotations

import json
import sys
import time

import httpx


def main() -> None:
    url, model, out = sys.argv[1:4]
    started = time.time()
    while time.time() - started < 185:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    calls = {
        "server_info": ("get", "/server_info", None),
        "v1_models": ("get", "/v1/models", None),
        "metrics": ("get", "/metrics", None),
        "completions_unknown_model": ("post", "/v1/completions",
                                      {"model": "x", "prompt": "Hello", "max_tokens": 8}),
        "completions_n2": ("post", "/v1/completions", {"model": model, "prompt": "Hello",
                                                       "max_tokens": 8, "n": 2}),
        "chat": ("post", "/v1/chat/completions", {
            "model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}),
        "generate_text": ("post", "/generate", {"text": "Hello",
                                                "sampling_params": {"max_new_tokens": 8}}),
        "generate_ids": ("post", "/generate", {"input_ids": [5, 6, 7],
                                               "sampling_params": {"max_new_tokens": 8}}),
        "generate_list": ("post", "/generate", {"text": ["a", "b"],
                                                "sampling_params": {"max_new_tokens": 4}}),
        "stream": ("post", "/v1/completions", {"model": model, "prompt": "Hi",
                                               "max_tokens": 4, "stream": True}),
        "flush_cache": ("post", "/flush_cache", None),
    }
    answers: dict[str, object] = {"startup_s": round(time.time() - started, 1)}
    for name, (method, path, body) in calls.items():
        try:
            kwargs = {"json": body} if body is not None else {}
            resp = getattr(httpx, method)(url + path, timeout=30, **kwargs)
            answers[name] = {"status": resp.status_code, "body": resp.text[:20000]}
        except httpx.HTTPError as exc:
            answers[name] = {"error": repr(exc)}
    with open(out, "w") as fh:
        json.dump(answers, fh, indent=1)
    print({k: v.get("status") if isinstance(v, dict) else v for k, v in answers.items()})


if __name__ == "__main__":
    main()
