"""Drives a running `ringserve serve` with the official `openai` Python package, as users do.

Usage: check_openai_sdk.py BASE_URL API_KEY MODEL. Started by tests/serve_openai_sdk.rs, which
starts the server (with --api-key API_KEY and --max-in-flight 1) and fails if this exits non-zero.
Every check prints one line; the first failure raises.
"""

import json
import socket
import sys
import threading
import time
import urllib.parse

import openai

BASE, KEY, MODEL = sys.argv[1], sys.argv[2], sys.argv[3]
client = openai.OpenAI(base_url=BASE, api_key=KEY, max_retries=0, timeout=120)
GREEDY = dict(temperature=0, max_tokens=10, extra_body={"ignore_eos": True})


def check(name):
    def wrap(f):
        f()
        print(f"ok   {name}", flush=True)
        return f

    return wrap


@check("models.list names the served model")
def _():
    ids = [m.id for m in client.models.list()]
    assert ids == [MODEL], ids


@check("completions: non-streaming, greedy, usage matches")
def _():
    r = client.completions.create(model=MODEL, prompt="Once upon a time", **GREEDY)
    assert r.object == "text_completion"
    assert len(r.choices) == 1 and r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 10
    assert r.usage.total_tokens == r.usage.prompt_tokens + 10
    again = client.completions.create(model=MODEL, prompt="Once upon a time", **GREEDY)
    assert again.choices[0].text == r.choices[0].text


@check("completions: streaming equals non-streaming, usage chunk last")
def _():
    whole = client.completions.create(model=MODEL, prompt="The sea", **GREEDY)
    parts, usage, finish = [], None, None
    for chunk in client.completions.create(
        model=MODEL, prompt="The sea", stream=True, stream_options={"include_usage": True}, **GREEDY
    ):
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            parts.append(c.text)
            finish = c.finish_reason or finish
    assert "".join(parts) == whole.choices[0].text, (parts, whole.choices[0].text)
    assert finish == "length" and usage.completion_tokens == 10, (finish, usage)


@check("chat: non-streaming and streaming agree; the role comes first")
def _():
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello!"}]
    whole = client.chat.completions.create(model=MODEL, messages=msgs, **GREEDY)
    assert whole.choices[0].message.role == "assistant"
    stream = client.chat.completions.create(model=MODEL, messages=msgs, stream=True, **GREEDY)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == "length"


@check("n: n choices; seed: reproducible, sample i is seed + i's")
def _():
    args = dict(model=MODEL, prompt="A", max_tokens=8, extra_body={"ignore_eos": True})
    three = client.completions.create(n=3, seed=11, **args)
    assert [c.index for c in three.choices] == [0, 1, 2]
    assert three.usage.completion_tokens == 24
    same = client.completions.create(n=3, seed=11, **args)
    assert [c.text for c in same.choices] == [c.text for c in three.choices]
    second = client.completions.create(n=1, seed=12, **args)
    assert second.choices[0].text == three.choices[1].text
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], n=2, seed=5, max_tokens=4
    )
    assert [c.index for c in chat.choices] == [0, 1]


@check("stop: the text is cut before the stop string, finish_reason stop")
def _():
    text = client.completions.create(model=MODEL, prompt="Tell me", **GREEDY).choices[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    r = client.completions.create(model=MODEL, prompt="Tell me", stop=[stop], **GREEDY)
    assert r.choices[0].text == text[: text.find(stop)], (r.choices[0].text, text, stop)
    assert r.choices[0].finish_reason == "stop"


@check("logprobs: completions' and chat's shapes")
def _():
    r = client.completions.create(model=MODEL, prompt="Hi", logprobs=3, **GREEDY)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 10
    assert all(1 <= len(t) <= 3 for t in lp.top_logprobs)
    assert all(p <= 0 for p in lp.token_logprobs)
    c = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], logprobs=True, top_logprobs=2, **GREEDY
    )
    content = c.choices[0].logprobs.content
    assert len(content) == 10 and all(len(t.top_logprobs) == 2 for t in content)
    # Greedy picks the most likely token.
    assert all(t.logprob >= max(a.logprob for a in t.top_logprobs) - 1e-4 for t in content)


@check("structured output: json_schema and the SDK's parse() with a pydantic model")
def _():
    from typing import List, Literal

    from pydantic import BaseModel, Field

    schema = {
        "type": "object",
        "properties": {
            "title": {"type": "string", "maxLength": 10},
            "year": {"type": "integer", "minimum": 1900, "maximum": 2100},
            "genre": {"enum": ["drama", "comedy", "horror"]},
        },
        "required": ["title", "year", "genre"],
        "additionalProperties": False,
    }
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "A film, as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "film", "schema": schema}},
        max_tokens=200,
        seed=3,
    )
    film = json.loads(r.choices[0].message.content)
    assert r.choices[0].finish_reason == "stop", r.choices[0]
    assert set(film) == {"title", "year", "genre"}, film
    assert len(film["title"]) <= 10 and 1900 <= film["year"] <= 2100, film
    assert film["genre"] in ("drama", "comedy", "horror"), film

    class Pet(BaseModel):
        kind: Literal["cat", "dog"]
        age: int = Field(ge=0, le=30)

    class Person(BaseModel):
        name: str = Field(max_length=6)
        pets: List[Pet] = Field(max_length=2)

    parsed = client.chat.completions.parse(
        model=MODEL,
        messages=[{"role": "user", "content": "A person with pets."}],
        response_format=Person,
        max_tokens=300,
        seed=9,
    )
    person = parsed.choices[0].message.parsed
    assert isinstance(person, Person), parsed.choices[0].message
    assert len(person.name) <= 6 and len(person.pets) <= 2, person


@check("errors: unknown model 404, bad field 400, no key 401")
def _():
    try:
        client.completions.create(model="gpt-4", prompt="x", max_tokens=1)
        raise AssertionError("no error")
    except openai.NotFoundError as e:
        assert e.status_code == 404
    try:
        client.completions.create(model=MODEL, prompt="x", temperature=-1)
        raise AssertionError("no error")
    except openai.BadRequestError as e:
        assert e.body["param"] == "temperature", e.body
    keyless = openai.OpenAI(base_url=BASE, api_key="wrong", max_retries=0)
    try:
        keyless.models.list()
        raise AssertionError("no error")
    except openai.AuthenticationError as e:
        assert e.status_code == 401


@check("overload: 429 while the admission limit is held; a closed stream frees it")
def _():
    started = threading.Event()
    done = threading.Event()

    def hold():
        s = client.completions.create(
            model=MODEL, prompt="x", max_tokens=3000, stream=True, extra_body={"ignore_eos": True}
        )
        for _ in s:
            started.set()
            if done.is_set():
                break
        s.close()

    t = threading.Thread(target=hold)
    t.start()
    assert started.wait(60)
    try:
        client.completions.create(model=MODEL, prompt="x", max_tokens=1)
        raise AssertionError("no 429")
    except openai.RateLimitError as e:
        assert e.status_code == 429
    finally:
        done.set()
        t.join()
    deadline = time.monotonic() + 10
    while True:
        try:
            client.completions.create(model=MODEL, prompt="x", max_tokens=1)
            break
        except openai.RateLimitError:
            assert time.monotonic() < deadline, "the closed stream still holds its admission"
            time.sleep(0.05)


@check("SSE framing on the wire: data lines, a blank line after each, [DONE] last")
def _():
    url = urllib.parse.urlparse(BASE)
    body = json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 3, "stream": True})
    req = (
        f"POST {url.path}/completions HTTP/1.1\r\nhost: {url.netloc}\r\nconnection: close\r\n"
        f"authorization: Bearer {KEY}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n{body}"
    )
    s = socket.create_connection((url.hostname, url.port))
    s.sendall(req.encode())
    raw = b""
    while chunk := s.recv(65536):
        raw += chunk
    head, _, rest = raw.partition(b"\r\n\r\n")
    assert b"text/event-stream" in head, head
    # De-chunk.
    data = b""
    while rest:
        size, _, rest = rest.partition(b"\r\n")
        n = int(size, 16)
        if n == 0:
            break
        data, rest = data + rest[:n], rest[n + 2 :]
    events = data.decode().split("\n\n")
    assert events[-1] == "", events
    events = events[:-1]
    assert all(e.startswith("data: ") and "\n" not in e for e in events), events
    assert events[-1] == "data: [DONE]", events
    for e in events[:-1]:
        json.loads(e[len("data: ") :])


print("all openai SDK checks passed")
