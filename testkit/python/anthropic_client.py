"""Messages through the official anthropic SDK, as an application makes them, for sluice's tests
(`scripts/ensure-deps anthropic` installs the SDK into the repo's .venv).

  anthropic_client.py BASE_URL N json|stream [NAME=VALUE ...]
      Makes N messages one after the other with one client at BASE_URL (http://127.0.0.1:PORT),
      each with the headers given; `stream` streams them. The client never retries
      (max_retries=0) and gives each call 30 s. Prints one JSON line per call, in the shape
      openai_client.py prints:
        {"status": 200, "error_type": null, "headers": {...}, "usage": {...} or null,
         "content": "...", "first_chunk_ms": null, "elapsed_ms": 20.1, "error": null,
         "message": null}
      An answer the SDK raises for has its status, headers, body (`error`: the JSON the SDK
      parsed) and the exception's message (`message`), `error_type` naming the exception
      (RateLimitError for a 429).
"""

import json
import sys
import time

import anthropic

MODEL = "test-model"
TIMEOUT_S = 30


def milliseconds_since(started):
    return round((time.monotonic() - started) * 1000, 3)


def answer(status, headers, **fields):
    return {"status": status, "error_type": None, "headers": dict(headers), "usage": None,
            "content": "", "first_chunk_ms": None, "error": None, "message": None, **fields}


def call(client, stream):
    started = time.monotonic()
    request = {"model": MODEL, "max_tokens": 100,
               "messages": [{"role": "user", "content": "hello"}]}
    try:
        if stream:
            with client.messages.with_streaming_response.create(stream=True, **request) as raw:
                events = list(raw.parse())
                usage = {}
                for event in events:
                    part = getattr(event, "usage", None) or getattr(
                        getattr(event, "message", None), "usage", None)
                    if part is not None:
                        usage.update({k: v for k, v in part.model_dump(mode="json").items()
                                      if v is not None})
                result = answer(raw.status_code, raw.headers, usage=usage or None)
        else:
            raw = client.messages.with_raw_response.create(**request)
            message = raw.parse()
            content = "".join(getattr(block, "text", "") for block in message.content)
            result = answer(raw.status_code, raw.headers,
                            usage=message.usage.model_dump(mode="json"), content=content)
    except anthropic.APIStatusError as error:
        result = answer(error.status_code, error.response.headers,
                        error_type=type(error).__name__, error=error.body,
                        message=error.message)
    except anthropic.APIError as error:
        result = answer(0, {}, error_type=type(error).__name__, error=str(error))
    result["elapsed_ms"] = milliseconds_since(started)
    return result


def main(base_url, n, mode, pairs):
    headers = dict(pair.split("=", 1) for pair in pairs)
    http_client = anthropic.DefaultHttpxClient(trust_env=False)
    client = anthropic.Anthropic(base_url=base_url, api_key="sk-ant-test", max_retries=0,
                                 timeout=TIMEOUT_S, default_headers=headers,
                                 http_client=http_client)
    for _ in range(n):
        print(json.dumps(call(client, mode == "stream")), flush=True)


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[3] in ("json", "stream"):
        main(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:])
    else:
        sys.exit(__doc__)
