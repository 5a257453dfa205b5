"""The LLM responses the token-budget setups answer with, the very bodies `bench/micro.rs`'s
usage cases read (bench/fixtures/llm/): a 4 KiB OpenAI Chat Completions response with its
`usage`, and an OpenAI chat stream of 200 events whose last chunk before `[DONE]` has the usage
(as with `stream_options.include_usage`)."""

from .envoy_config import Response
from .paths import FIXTURES

JSON = "application/json"
EVENT_STREAM = "text/event-stream"
LLM = FIXTURES / "llm"


def json_response():
    return Response((LLM / "openai-chat-4k.json").read_text(), JSON)


def event_stream_response():
    return Response((LLM / "openai-chat-200-events.txt").read_text(), EVENT_STREAM)
