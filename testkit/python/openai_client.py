"""Chat completions through the official openai SDK, as an application makes them, for sluice's
tests (`scripts/ensure-deps openai` installs the SDK into the repo's .venv).

  openai_client.py BASE_URL N json|stream [--model=NAME] [--max-tokens=N] [NAME=VALUE ...]
      Makes N chat completions one after the other with one client at BASE_URL
      (http://127.0.0.1:PORT/v1), each with the headers given; `stream` streams them and asks for
      the usage (stream_options.include_usage). --model names the model (test-model by
      default), --max-tokens sets max_tokens (none by default). The client never retries (max_retries=0: a 429
      is reported, not retried) and gives each call 30 s. Prints one JSON line per call:
        {"status": 200, "error_type": null, "headers": {...}, "usage": {...} or null,
         "content": "...", "first_chunk_ms": 12.5 or null, "elapsed_ms": 20.1, "error": null}
      An answer the SDK raises for (429: RateLimitError, 503: InternalServerError, ...) has its
      status, headers (retry-after, x-ratelimit-*...) and body (`error`, parsed JSON or text),
      `error_type` naming the exception, `message` the exception's message. A call that got no answer has status 0; one whose
      stream broke has what it got before. Both have the exception's class in `error_type`
      (APIConnectionError, as the SDK wraps a broken connection) and its cause in `error`.
      first_chunk_ms: from the call to the first chunk of a stream out of the SDK.
"""

import json
import sys
import time

import httpx2
import openai

MODEL = "test-model"
TIMEOUT_S = 30


def milliseconds_since(started):
    return round((time.monotonic() - started) * 1000, 3)


def usage_of(completion):
    usage = getattr(completion, "usage", None)
    return usage.model_dump(mode="json", warnings=False) if usage is not None else None


def answer(status, headers, **fields):
    return {"status": status, "error_type": None, "headers": dict(headers), "usage": None,
            "content": "", "first_chunk_ms": None, "error": None, "message": None, **fields}


def failure(error):
    """What a failed call reports: the exception's class, and its cause's message (the SDK
    wraps a broken connection in APIConnectionError: "Connection error.")."""
    return {"error_type": type(error).__name__, "error": str(error.__cause__ or error)}


def read_stream(raw, started):
    """A streamed answer: its content and usage, when its first chunk came, and how it broke if
    it did."""
    content, usage, first_chunk_ms, broken = [], None, None, {}
    try:
        for chunk in raw.parse():
            if first_chunk_ms is None:
                first_chunk_ms = milliseconds_since(started)
            content.extend(choice.delta.content or "" for choice in chunk.choices)
            usage = usage_of(chunk) or usage
    except (openai.APIError, httpx2.HTTPError) as error:
        broken = failure(error)
    return answer(raw.status_code, raw.headers, usage=usage, content="".join(content),
                  first_chunk_ms=first_chunk_ms, **broken)


def read_json(raw):
    completion = raw.parse()
    content = "".join(choice.message.content or "" for choice in completion.choices)
    return answer(raw.status_code, raw.headers, usage=usage_of(completion), content=content)


def call(client, stream, options):
    started = time.monotonic()
    request = {"model": options.get("model", MODEL),
               "messages": [{"role": "user", "content": "hello"}]}
    if "max-tokens" in options:
        request["max_tokens"] = int(options["max-tokens"])
    if stream:
        request.update(stream=True, stream_options={"include_usage": True})
    try:
        raw = client.chat.completions.with_raw_response.create(**request)
        result = read_stream(raw, started) if stream else read_json(raw)
    except openai.APIStatusError as error:
        result = answer(error.status_code, error.response.headers,
                        error_type=type(error).__name__, error=error.body,
                        message=error.message)
    except (openai.APIError, httpx2.HTTPError) as error:
        result = answer(0, {}, **failure(error))
    result["elapsed_ms"] = milliseconds_since(started)
    return result


def main(base_url, n, mode, pairs):
    options = dict(p.removeprefix("--").split("=", 1) for p in pairs if p.startswith("--"))
    headers = dict(pair.split("=", 1) for pair in pairs if not pair.startswith("--"))
    # No proxy from the environment: the tests talk to loopback only.
    http_client = openai.DefaultHttpxClient(trust_env=False)
    client = openai.OpenAI(base_url=base_url, api_key="sk-test", max_retries=0,
                           timeout=TIMEOUT_S, default_headers=headers, http_client=http_client)
    for _ in range(n):
        print(json.dumps(call(client, mode == "stream", options)), flush=True)


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[3] in ("json", "stream"):
        main(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:])
    else:
        sys.exit(__doc__)
