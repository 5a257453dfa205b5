"""The LLM responses the token-budget setups answer with, the same bodies as `bench/micro.rs`'s
usage cases (`openai_response`, `openai_event_stream`): a 4 KiB OpenAI Chat Completions response
with its `usage`, and an OpenAI chat stream of 200 events whose last chunk before `[DONE]` has the
usage (as with `stream_options.include_usage`)."""

from .envoy_config import Response

JSON = "application/json"
EVENT_STREAM = "text/event-stream"

_SENTENCE = ('A token budget charges each call what it used: the \\"usage\\" '
             'object at the end of the response says how much.\\n')

_HEAD = """{
  "id": "chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG",
  "object": "chat.completion",
  "created": 1741570283,
  "model": "gpt-4o-2024-08-06",
  "choices": [
    {
      "index": 0,
      "message": {
        "role": "assistant",
        "content": \""""

_TAIL = """",
        "refusal": null,
        "annotations": []
      },
      "logprobs": null,
      "finish_reason": "stop"
    }
  ],
  "usage": {
    "prompt_tokens": 1117,
    "completion_tokens": 846,
    "total_tokens": 1963,
    "prompt_tokens_details": {
      "cached_tokens": 0,
      "audio_tokens": 0
    },
    "completion_tokens_details": {
      "reasoning_tokens": 0,
      "audio_tokens": 0,
      "accepted_prediction_tokens": 0,
      "rejected_prediction_tokens": 0
    }
  },
  "service_tier": "default",
  "system_fingerprint": "fp_fc9f1d7035"
}
"""

_WORDS = ["A", " token", " budget", " charges", " each call", " what", " it used", ".\\n"]
_STREAM_USAGE = ('{"prompt_tokens":19,"completion_tokens":198,"total_tokens":217,'
                 '"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},'
                 '"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,'
                 '"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}}')


def openai_response():
    """4,096 bytes: the answer's text (escapes included) padded to size, then the usage."""
    room = 4096 - len(_HEAD) - len(_TAIL)
    content = (_SENTENCE * (room // len(_SENTENCE) + 1))[:room]
    # Never end the text on half an escape.
    content = content.rstrip("\\")
    body = _HEAD + content + " " * (room - len(content)) + _TAIL
    assert len(body.encode()) == 4096, len(body.encode())
    return body


def openai_event_stream():
    """198 chunks of a word or two, the chunk that finishes, the chunk with the usage, [DONE]."""

    def chunk(choices, usage):
        return ('data: {"id":"chatcmpl-AqN3bH0uDq4kq7vRc9fgx0Yx2Ezal","object":"chat.completion.chunk",'
                '"created":1737037735,"model":"gpt-4o-mini-2024-07-18","service_tier":"default",'
                f'"system_fingerprint":"fp_72ed7ab54c","choices":[{choices}],"usage":{usage}}}\n\n')

    def delta(content, finish):
        return f'{{"index":0,"delta":{{"content":"{content}"}},"logprobs":null,"finish_reason":{finish}}}'

    events = [chunk(delta(_WORDS[i % len(_WORDS)], "null"), "null") for i in range(198)]
    events.append(chunk(delta("", '"stop"'), "null"))
    events.append(chunk("", _STREAM_USAGE))
    events.append("data: [DONE]\n\n")
    return "".join(events)


def json_response():
    return Response(openai_response(), JSON)


def event_stream_response():
    return Response(openai_event_stream(), EVENT_STREAM)
