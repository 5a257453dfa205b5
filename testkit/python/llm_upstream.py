"""An OpenAI- and Anthropic-compatible upstream for sluice's tests, standard library only:
HTTP/1.1 with keep-alive, JSON answers with a Content-Length, streams as server-sent events in
chunked transfer encoding, one chunk per event, each sent as soon as it is made (a stream is
generated as it goes, never held whole).

  llm_upstream.py serve
      Serves on a free port of 127.0.0.1, prints the port on a line, and serves until killed.

Routes
  POST /v1/chat/completions   OpenAI Chat Completions: JSON, or with "stream": true the chunks
      `data: {...}` of choices[].delta (a role chunk, the content chunks, a finish_reason chunk),
      then `data: [DONE]`. With "stream_options": {"include_usage": true}, as OpenAI does, every
      chunk has "usage": null and a last chunk with empty choices carries the usage.
  POST /v1/responses   OpenAI Responses: JSON, or with "stream": true the events
      response.created, response.in_progress, response.output_item.added,
      response.content_part.added, response.output_text.delta (the content events),
      response.output_text.done, response.content_part.done, response.output_item.done and
      response.completed, whose response.usage has input_tokens, output_tokens, total_tokens.
      The done events and response.completed repeat the whole text, as OpenAI does, up to 1 MiB
      of it; past that they carry an empty text.
  POST /v1/messages   Anthropic Messages: JSON with usage.input_tokens and usage.output_tokens,
      or with "stream": true message_start (message.usage: input_tokens, output_tokens 1),
      content_block_start, ping, content_block_delta (the content events), content_block_stop,
      message_delta (usage.output_tokens: the cumulative output), message_stop.
  GET /_calls   The JSON list of the requests received, oldest first, each {"method", "path" (with
      its query), "headers": {lower-cased name: value}, "body": text}; /_calls and /healthz
      themselves are left out.
  GET /healthz   200 "ok".
  Any other request   200 "ok", after N ms when its query has ms=N (GET /slow?ms=5000).

Request headers that shape the answer, all optional:
  x-test-usage: input=10,output=20   The usage reported; this is the default. total=N sets the
      total, otherwise input + output; a count left out is 0 (total=30 alone reports input 0,
      output 0, total 30). Any integer is taken as given: input=-5, total=99999999999999999999.
      Anthropic has no total field: it reports input and output only. cache_read=N and
      cache_write=N add Anthropic's cache_read_input_tokens and cache_creation_input_tokens
      (in message_start's usage when streamed); cached=N and reasoning=N add OpenAI's
      cached_tokens and reasoning_tokens details (and are among input and output, as OpenAI
      counts them).
  x-test-usage: none   No usage anywhere: no usage object, header or trailer.
  x-test-usage: bad    Every count is the JSON string "many" instead of a number.
  x-test-events: N   Content events in a stream (default 3). A JSON answer has the same text.
  x-test-event-bytes: N   Bytes of text in each content event (default 8).
  x-test-stream-bytes: N   A stream of about N bytes of events (the chunked framing aside), in
      content events of 16 KiB, the usage at its end: replaces x-test-events and
      x-test-event-bytes. 104857600 is a 100 MiB stream.
  x-test-first-byte-ms: N   Waits N ms before the first byte of the answer (its status line).
  x-test-event-ms: N   Waits N ms before each event of a stream after the first.
  x-test-cut-after: N   Closes the connection (FIN) after N events of a stream, every event
      counted, without the last chunk; for a JSON answer, after N bytes of its body.
  x-test-reset: 1   Resets the connection (TCP RST) as soon as the request is read: no answer.
  x-test-status: N   Answers status N with the API's error JSON (OpenAI's {"error": {...}},
      Anthropic's {"type": "error", ...}) and no usage; on other paths, plain text.
  x-test-usage-header: NAME   Also reports the total tokens in the response header NAME.
  x-test-model: NAME   The model the answer says served it (OpenAI's and the Responses API's
      model, Anthropic's message.model), as an upstream that maps or aliases the one asked for;
      by default the request's model.
  x-test-content-encoding: NAME   The answer of an API in content coding NAME: gzip or x-gzip
      (gzip), deflate (zlib); a stream's events each compressed and flushed (Z_SYNC_FLUSH) in
      the chunk of their own, as compressing servers stream. Any other name is only a label:
      the body goes as it is, with content-encoding NAME (br: a coding nothing here can make).
      negotiate: gzip or deflate, whichever accept-encoding gives the highest q (the first of
      equals), else none.
  x-test-usage-trailer: NAME   A stream also reports the total tokens in the trailer NAME,
      announced by a Trailer header. Envoy forwards HTTP/1.1 trailers only where
      http_protocol_options has enable_trailers: true, on the upstream cluster (the testkit's
      sets it) and on the listener for the client to get them.
"""

import dataclasses
import itertools
import json
import socket
import struct
import sys
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator
from urllib.parse import parse_qs, urlsplit

DEFAULT_USAGE = "input=10,output=20"
DEFAULT_EVENTS = 3
DEFAULT_EVENT_BYTES = 8
EVENT_SIZE = 16 * 1024
# The whole text that the Responses API's done events repeat, at most.
REPEATED_TEXT_LIMIT = 1 << 20
WORDS = "lorem ipsum dolor sit amet "
DEFAULT_MODEL = "test-model"


class BadControl(Exception):
    """A test header with a value that means nothing: the answer is a 400 naming it."""


def parse_usage(value):
    """The usage of `x-test-usage`: {"input", "output", "total"}, or None for none."""
    if value == "none":
        return None
    if value == "bad":
        return {"input": "many", "output": "many", "total": "many"}
    counts = {}
    for part in value.split(","):
        name, _, number = part.partition("=")
        if name.strip() not in ("input", "output", "total") + PRICED:
            raise ValueError(f"unknown count {name.strip()!r}")
        counts[name.strip()] = int(number)
    sent, received = counts.get("input", 0), counts.get("output", 0)
    usage = {"input": sent, "output": received, "total": counts.get("total", sent + received)}
    usage.update({name: counts[name] for name in PRICED if name in counts})
    return usage


# The priced kinds x-test-usage may add: Anthropic's cache reads and writes, OpenAI's cached and
# reasoning tokens (details of its input and output).
PRICED = ("cache_read", "cache_write", "cached", "reasoning")


def openai_details(usage, input_name, output_name):
    """OpenAI's details objects of the counts x-test-usage gave."""
    details = {}
    if "cached" in usage:
        details[input_name] = {"cached_tokens": usage["cached"]}
    if "reasoning" in usage:
        details[output_name] = {"reasoning_tokens": usage["reasoning"]}
    return details


def anthropic_cache(usage):
    """Anthropic's cache counts of the counts x-test-usage gave."""
    names = (("cache_write", "cache_creation_input_tokens"),
             ("cache_read", "cache_read_input_tokens"))
    return {field: usage[name] for name, field in names if name in usage}


@dataclasses.dataclass
class Shape:
    """What the test headers ask of one answer."""

    usage: dict | None
    events: int
    event_bytes: int
    stream_bytes: int | None
    first_byte_ms: int
    event_ms: int
    cut_after: int | None
    reset: bool
    status: int
    usage_header: str | None
    usage_trailer: str | None
    coding: str | None
    model: str | None

    @staticmethod
    def from_headers(headers):
        def number(name, default):
            value = headers.get(name)
            if value is None:
                return default
            try:
                return int(value)
            except ValueError as error:
                raise BadControl(f"{name}: {value}: {error}") from None

        usage = headers.get("x-test-usage", DEFAULT_USAGE)
        try:
            parsed_usage = parse_usage(usage)
        except ValueError as error:
            raise BadControl(f"x-test-usage: {usage}: {error}") from None
        return Shape(
            usage=parsed_usage,
            events=number("x-test-events", DEFAULT_EVENTS),
            event_bytes=number("x-test-event-bytes", DEFAULT_EVENT_BYTES),
            stream_bytes=number("x-test-stream-bytes", None),
            first_byte_ms=number("x-test-first-byte-ms", 0),
            event_ms=number("x-test-event-ms", 0),
            cut_after=number("x-test-cut-after", None),
            reset="x-test-reset" in headers,
            status=number("x-test-status", 200),
            usage_header=headers.get("x-test-usage-header"),
            usage_trailer=headers.get("x-test-usage-trailer"),
            coding=coding_of(headers),
            model=headers.get("x-test-model"),
        )


def coding_of(headers):
    """The content coding x-test-content-encoding asks for, None for none."""
    coding = headers.get("x-test-content-encoding")
    if coding != "negotiate":
        return coding
    best, best_q = None, 0.0
    for item in headers.get("accept-encoding", "").split(","):
        name, *params = [part.strip() for part in item.split(";")]
        q = 1.0
        for param in params:
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        if name.lower() in ("gzip", "deflate") and q > best_q:
            best, best_q = name.lower(), q
    return best


class Encoder:
    """Compresses an answer in its coding, part by part, each part flushed (identity: as is)."""

    WBITS = {"gzip": 31, "x-gzip": 31, "deflate": 15}

    def __init__(self, coding):
        wbits = self.WBITS.get(coding)
        self.stream = zlib.compressobj(6, zlib.DEFLATED, wbits) if wbits else None

    def part(self, data):
        if self.stream is None:
            return data
        return self.stream.compress(data) + self.stream.flush(zlib.Z_SYNC_FLUSH)

    def end(self):
        return self.stream.flush() if self.stream is not None else b""


@dataclasses.dataclass
class Reply:
    """One answer's fixed parts, and its text: `piece` repeated `count` times."""

    model: str
    usage: dict | None
    include_usage: bool
    piece: str
    count: int
    created: int = dataclasses.field(default_factory=lambda: int(time.time()))
    # The Responses API numbers its events.
    sequence: Iterator[int] = dataclasses.field(default_factory=itertools.count, init=False)

    def text(self):
        return self.piece * self.count

    def repeated_text(self):
        """The whole text where an event repeats it, empty past REPEATED_TEXT_LIMIT."""
        return self.text() if len(self.piece) * self.count <= REPEATED_TEXT_LIMIT else ""


def text_of(size):
    return (WORDS * (size // len(WORDS) + 1))[:size]


def data_event(payload):
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def named_event(name, payload):
    return b"event: " + name.encode() + b"\n" + data_event(payload)


# OpenAI Chat Completions.

def chat_usage(usage):
    return {"prompt_tokens": usage["input"], "completion_tokens": usage["output"],
            "total_tokens": usage["total"],
            **openai_details(usage, "prompt_tokens_details", "completion_tokens_details")}


def chat_json(reply):
    answer = {
        "id": "chatcmpl-test", "object": "chat.completion", "created": reply.created,
        "model": reply.model, "system_fingerprint": "fp_test",
        "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None,
                     "message": {"role": "assistant", "content": reply.text(), "refusal": None}}],
    }
    if reply.usage is not None:
        answer["usage"] = chat_usage(reply.usage)
    return answer


def chat_chunk(reply, choices, usage=None):
    chunk = {"id": "chatcmpl-test", "object": "chat.completion.chunk", "created": reply.created,
             "model": reply.model, "system_fingerprint": "fp_test", "choices": choices}
    if reply.include_usage:
        chunk["usage"] = usage
    return data_event(chunk)


def chat_choice(delta, finish_reason=None):
    return [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]


def chat_delta(reply, piece):
    return chat_chunk(reply, chat_choice({"content": piece}))


def chat_stream(reply):
    yield chat_chunk(reply, chat_choice({"role": "assistant", "content": "", "refusal": None}))
    for _ in range(reply.count):
        yield chat_delta(reply, reply.piece)
    yield chat_chunk(reply, chat_choice({}, "stop"))
    if reply.include_usage and reply.usage is not None:
        yield chat_chunk(reply, [], chat_usage(reply.usage))
    yield b"data: [DONE]\n\n"


def openai_error(status):
    return {"error": {"message": f"the test asked for {status}", "type": "server_error",
                      "param": None, "code": None}}


# OpenAI Responses.

def responses_usage(usage):
    return {"input_tokens": usage["input"],
            "input_tokens_details": {"cached_tokens": usage.get("cached", 0)},
            "output_tokens": usage["output"],
            "output_tokens_details": {"reasoning_tokens": usage.get("reasoning", 0)},
            "total_tokens": usage["total"]}


def responses_part(text):
    return {"type": "output_text", "text": text, "annotations": []}


def responses_item(status, content):
    return {"type": "message", "id": "msg_test", "status": status, "role": "assistant",
            "content": content}


def responses_object(reply, status, output):
    """A response object: in progress, its usage is null; completed, it has the usage."""
    answer = {"id": "resp_test", "object": "response", "created_at": reply.created,
              "status": status, "model": reply.model, "output": output}
    if reply.usage is not None:
        answer["usage"] = responses_usage(reply.usage) if status == "completed" else None
    return answer


def responses_json(reply):
    item = responses_item("completed", [responses_part(reply.text())])
    return responses_object(reply, "completed", [item])


def responses_event(reply, name, **fields):
    return named_event(name, {"type": name, "sequence_number": next(reply.sequence), **fields})


def responses_delta(reply, piece):
    return responses_event(reply, "response.output_text.delta", item_id="msg_test",
                           output_index=0, content_index=0, delta=piece, logprobs=[])


def responses_stream(reply):
    started = responses_object(reply, "in_progress", [])
    yield responses_event(reply, "response.created", response=started)
    yield responses_event(reply, "response.in_progress", response=started)
    yield responses_event(reply, "response.output_item.added", output_index=0,
                          item=responses_item("in_progress", []))
    place = {"item_id": "msg_test", "output_index": 0, "content_index": 0}
    yield responses_event(reply, "response.content_part.added", **place, part=responses_part(""))
    for _ in range(reply.count):
        yield responses_delta(reply, reply.piece)
    text = reply.repeated_text()
    yield responses_event(reply, "response.output_text.done", **place, text=text, logprobs=[])
    yield responses_event(reply, "response.content_part.done", **place, part=responses_part(text))
    item = responses_item("completed", [responses_part(text)])
    yield responses_event(reply, "response.output_item.done", output_index=0, item=item)
    yield responses_event(reply, "response.completed",
                          response=responses_object(reply, "completed", [item]))


# Anthropic Messages.

def messages_json(reply):
    answer = {"id": "msg_test", "type": "message", "role": "assistant", "model": reply.model,
              "content": [{"type": "text", "text": reply.text()}], "stop_reason": "end_turn",
              "stop_sequence": None}
    if reply.usage is not None:
        answer["usage"] = {"input_tokens": reply.usage["input"],
                           "output_tokens": reply.usage["output"], **anthropic_cache(reply.usage)}
    return answer


def messages_delta(reply, piece):
    return named_event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                               "delta": {"type": "text_delta", "text": piece}})


def messages_stream(reply):
    message = {"id": "msg_test", "type": "message", "role": "assistant", "model": reply.model,
               "content": [], "stop_reason": None, "stop_sequence": None}
    delta = {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None}}
    if reply.usage is not None:
        received = reply.usage["output"]
        # Anthropic counts the first output token at once, then the cumulative output.
        message["usage"] = {"input_tokens": reply.usage["input"],
                            "output_tokens": 1 if isinstance(received, int) else received,
                            **anthropic_cache(reply.usage)}
        delta["usage"] = {"output_tokens": received}
    yield named_event("message_start", {"type": "message_start", "message": message})
    yield named_event("content_block_start", {"type": "content_block_start", "index": 0,
                                              "content_block": {"type": "text", "text": ""}})
    yield named_event("ping", {"type": "ping"})
    for _ in range(reply.count):
        yield messages_delta(reply, reply.piece)
    yield named_event("content_block_stop", {"type": "content_block_stop", "index": 0})
    yield named_event("message_delta", delta)
    yield named_event("message_stop", {"type": "message_stop"})


def anthropic_error(status):
    return {"type": "error",
            "error": {"type": "api_error", "message": f"the test asked for {status}"}}


@dataclasses.dataclass
class Api:
    """An API's answers, each made from a Reply: JSON, the stream's events, one content event;
    and its error JSON for a status."""

    answer: object
    stream: object
    delta: object
    error: object


APIS = {
    "/v1/chat/completions": Api(chat_json, chat_stream, chat_delta, openai_error),
    "/v1/responses": Api(responses_json, responses_stream, responses_delta, openai_error),
    "/v1/messages": Api(messages_json, messages_stream, messages_delta, anthropic_error),
}


class Calls:
    """The requests received, for GET /_calls."""

    def __init__(self):
        self.seen, self.lock = [], threading.Lock()

    def record(self, method, path, headers, body):
        call = {"method": method, "path": path, "body": body.decode("utf-8", "replace"),
                "headers": {name.lower(): value for name, value in headers.items()}}
        with self.lock:
            self.seen.append(call)

    def all(self):
        with self.lock:
            return list(self.seen)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        try:
            self.answer()
        except (BrokenPipeError, ConnectionResetError):
            # The client went away: what the test does to it, not an error here.
            self.close_connection = True

    do_POST = do_PUT = do_DELETE = do_PATCH = do_GET

    def log_request(self, code="-", size="-"):
        """Quiet: errors still go to stderr."""

    def answer(self):
        url = urlsplit(self.path)
        body = self.read_body()
        if url.path == "/_calls":
            return self.send_bytes(200, "application/json", json.dumps(self.server.calls.all()))
        if url.path == "/healthz":
            return self.send_bytes(200, "text/plain", "ok")
        self.server.calls.record(self.command, self.path, self.headers, body)
        try:
            shape = Shape.from_headers(self.headers)
        except BadControl as error:
            return self.send_bytes(400, "text/plain", str(error))
        if shape.reset:
            return self.reset()
        time.sleep(shape.first_byte_ms / 1000)
        api = APIS.get(url.path) if self.command == "POST" else None
        if api is None:
            return self.plain(url, shape)
        try:
            request = json.loads(body)
        except ValueError:
            request = None
        if not isinstance(request, dict):
            return self.send_bytes(400, "application/json", json.dumps(api.error(400)))
        if shape.status != 200:
            return self.send_bytes(shape.status, "application/json",
                                   json.dumps(api.error(shape.status)))
        if request.get("stream") is True:
            return self.stream(api, request, shape)
        reply = make_reply(request, shape, shape.event_bytes, shape.events)
        self.send_bytes(200, "application/json", json.dumps(api.answer(reply)), shape)

    def plain(self, url, shape):
        if shape.status != 200:
            return self.send_bytes(shape.status, "text/plain", f"the test asked for {shape.status}")
        delay_ms = parse_qs(url.query).get("ms", ["0"])[0]
        if not delay_ms.isdigit():
            return self.send_bytes(400, "text/plain", f"ms={delay_ms}: not a number of ms")
        time.sleep(int(delay_ms) / 1000)
        self.send_bytes(200, "text/plain", "ok")

    def read_body(self):
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            return self.read_chunked()
        return self.rfile.read(int(self.headers.get("content-length", 0)))

    def read_chunked(self):
        body = b""
        while True:
            size = int(self.rfile.readline().split(b";")[0], 16)
            if size == 0:
                while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                return body
            body += self.rfile.read(size)
            self.rfile.readline()

    def usage_header(self, shape):
        if shape.usage is not None and shape.usage_header:
            self.send_header(shape.usage_header, str(shape.usage["total"]))

    def send_bytes(self, status, content_type, text, shape=None):
        body = text.encode()
        if shape is not None:
            encoder = Encoder(shape.coding)
            body = encoder.part(body) + encoder.end()
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        if shape is not None:
            self.usage_header(shape)
            if shape.coding:
                self.send_header("content-encoding", shape.coding)
        self.end_headers()
        if shape is not None and shape.cut_after is not None:
            self.wfile.write(body[:shape.cut_after])
            self.close_connection = True
            return
        self.wfile.write(body)

    def stream(self, api, request, shape):
        if shape.stream_bytes is None:
            reply = make_reply(request, shape, shape.event_bytes, shape.events)
        else:
            # Content events of EVENT_SIZE bytes: the text fills what the event's JSON leaves.
            envelope = len(api.delta(make_reply(request, shape, 0, 0), ""))
            reply = make_reply(request, shape, max(EVENT_SIZE - envelope, 1),
                               max(shape.stream_bytes // EVENT_SIZE, 1))
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("transfer-encoding", "chunked")
        if shape.coding:
            self.send_header("content-encoding", shape.coding)
        self.usage_header(shape)
        trailer = shape.usage_trailer if shape.usage is not None else None
        if trailer:
            self.send_header("trailer", trailer)
        self.end_headers()
        encoder = Encoder(shape.coding)
        if not self.send_events(api.stream(reply), shape, encoder):
            return
        end = encoder.end()
        if end:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(end), end))
        last = f"{trailer}: {shape.usage['total']}\r\n" if trailer else ""
        self.wfile.write(f"0\r\n{last}\r\n".encode())

    def send_events(self, events, shape, encoder):
        """Sends the events, one chunk each, in the encoder's coding; False when it cut the
        stream (x-test-cut-after)."""
        for index, event in enumerate(events):
            if index == shape.cut_after:
                self.close_connection = True
                return False
            if index > 0 and shape.event_ms:
                time.sleep(shape.event_ms / 1000)
            event = encoder.part(event)
            self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
        return True

    def reset(self):
        """Closes with SO_LINGER 0, which sends RST; the server's own close then finds it closed."""
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.connection.close()
        self.close_connection = True


def make_reply(request, shape, piece_bytes, count):
    options = request.get("stream_options")
    include_usage = isinstance(options, dict) and options.get("include_usage") is True
    model = shape.model or str(request.get("model", DEFAULT_MODEL))
    return Reply(model=model, usage=shape.usage,
                 include_usage=include_usage, piece=text_of(piece_bytes), count=count)


class Server(ThreadingHTTPServer):
    # Concurrency tests open many connections at once.
    request_queue_size = 256

    def __init__(self):
        super().__init__(("127.0.0.1", 0), Handler)
        self.calls = Calls()


def serve():
    server = Server()
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    if sys.argv[1:] == ["serve"]:
        serve()
    else:
        sys.exit(__doc__)
