#!/usr/bin/env python3
"""Structured output against a running `ringserve serve` (any device), over its OpenAI HTTP API.

Usage: structured_gpu_check.py BASE_URL
1. 32 concurrent chat requests with a JSON schema (nested object, enum, array, required fields),
   sampled at temperature 1 with distinct seeds: every output must parse and match the schema.
2. Throughput, 64 concurrent completions of 128 tokens (ignore_eos), first free, then each
   constrained by a regex no 128 tokens can complete, then 63 free beside 1 constrained:
   output tok/s of each round (the cost of masks on the step).
Prints one line per result; exits 1 if any output breaks its schema.
"""
import json
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

BASE = sys.argv[1].rstrip("/")
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "role": {"enum": ["admin", "user", "guest"]},
        "scores": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
                   "minItems": 1, "maxItems": 4},
        "address": {"type": "object",
                    "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                                   "verified": {"type": "boolean"}},
                    "required": ["zip", "verified"], "additionalProperties": False},
    },
    "required": ["name", "role", "scores", "address"],
    "additionalProperties": False,
}


def post(path, body):
    req = urllib.request.Request(BASE + path, json.dumps(body).encode(),
                                 {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def valid(doc):
    if set(doc) - set(SCHEMA["properties"]) or not {"name", "role", "scores", "address"} <= set(doc):
        return False
    a = doc["address"]
    return (isinstance(doc["name"], str) and len(doc["name"]) <= 8
            and ("age" not in doc or (type(doc["age"]) is int and 0 <= doc["age"] <= 150))
            and doc["role"] in ("admin", "user", "guest")
            and 1 <= len(doc["scores"]) <= 4
            and all(type(s) is int and 0 <= s <= 9 for s in doc["scores"])
            and set(a) == {"zip", "verified"} and len(a["zip"]) == 5 and a["zip"].isdigit()
            and isinstance(a["verified"], bool))


def schema_request(seed):
    r = post("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "A user record, please."}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "u", "schema": SCHEMA}},
        "max_tokens": 400, "seed": seed, "temperature": 1.0})
    c = r["choices"][0]
    return c["message"]["content"], c["finish_reason"]


with ThreadPoolExecutor(32) as pool:
    results = list(pool.map(schema_request, range(32)))
bad = 0
for text, finish in results:
    try:
        ok = valid(json.loads(text)) and finish == "stop"
    except Exception:
        ok = False
    bad += not ok
print(f"schema: {32 - bad}/32 outputs parse and match the schema; e.g. {results[0][0]}")

PROMPT = list(range(1000, 1512))


def completion(constrained):
    body = {"prompt": PROMPT, "max_tokens": 128, "ignore_eos": True, "temperature": 1.0, "seed": 1}
    if constrained:
        body["structured_outputs"] = {"regex": "[a-z ]{5000}"}
    return post("/v1/completions", body)["usage"]["completion_tokens"]


for name, flags in [("free x64", [False] * 64), ("constrained x64", [True] * 64),
                    ("63 free + 1 constrained", [True] + [False] * 63), ("free x64 again", [False] * 64)]:
    with ThreadPoolExecutor(64) as pool:
        t0 = time.perf_counter()
        tokens = sum(pool.map(completion, flags))
        dt = time.perf_counter() - t0
    print(f"throughput {name}: {tokens} tokens in {dt:.2f} s = {tokens / dt:.0f} tok/s")
sys.exit(1 if bad else 0)
