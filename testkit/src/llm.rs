//! An LLM upstream and its clients, for the token-budget and concurrency tests.
//!
//! - `LlmUpstream`: `python/llm_upstream.py`, an OpenAI- and Anthropic-compatible HTTP/1.1
//!   server (standard library only) whose answers the test shapes with request headers
//!   (`x-test-usage`, `x-test-events`, `x-test-stream-bytes`, `x-test-cut-after`, ...: the
//!   script's docstring lists them) and which records what it received (`calls`);
//! - `call` and `post`: one request of any of the three APIs with a client of this crate that
//!   streams the answer (a 100 MiB stream is counted, not held), with its trailers and times;
//! - `openai_calls`: chat completions through the official openai SDK (`python/openai_client.py`,
//!   `scripts/ensure-deps openai`), as an application makes them.
//!
//! ```ignore
//! let upstream = LlmUpstream::start();
//! let envoy = Envoy::options(json).upstream(upstream.addr()).start();
//! let calls = openai_calls(envoy.addr(), 2, true, &[("x-test-usage", "input=10,output=20")]);
//! assert_eq!(calls[1].usage.as_ref().unwrap()["total_tokens"], 30);
//! let r = call(envoy.addr(), Api::Messages, true, &[("x-api-key", "alice")]);
//! assert_eq!(r.events().last().unwrap().event.as_deref(), Some("message_stop"));
//! ```

use crate::python::{Peer, Script};
use serde_json::Value;
use std::collections::HashMap;
use std::io::{self, BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The longest wait for one byte of an answer.
const IO_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest a whole answer may take.
const CALL_DEADLINE: Duration = Duration::from_secs(120);
/// How much of a body `LlmResponse::body` keeps: past it, the end.
const KEPT_BODY: usize = 1 << 20;
/// The openai client gives each call 30 s; the whole run gets that per call, and this.
const CLIENT_START: Duration = Duration::from_secs(30);
const CLIENT_CALL: Duration = Duration::from_secs(30);

/// `python/llm_upstream.py` on a free port of 127.0.0.1, killed by PID when dropped.
pub struct LlmUpstream {
    peer: Peer,
}

impl LlmUpstream {
    pub fn start() -> LlmUpstream {
        let peer = Script::stdlib("llm_upstream.py").serve(&[]);
        LlmUpstream { peer }
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.peer.port))
    }

    /// Its resident memory (VmRSS), in KiB: flat however long its streams.
    pub fn rss_kib(&self) -> u64 {
        self.peer.rss_kib()
    }

    /// Waits (5 s at most) until it has received `n` requests in all: requests sent to it
    /// through Envoy are then in flight here. Panics when they do not come.
    pub fn wait_for_calls(&self, n: usize) {
        let seen = crate::wait_for(Duration::from_secs(5), || {
            (self.calls().len() >= n).then_some(())
        });
        assert!(
            seen.is_some(),
            "the upstream saw {} calls, not {n}",
            self.calls().len()
        );
    }

    /// The requests it has received, oldest first (`GET /_calls`).
    pub fn calls(&self) -> Vec<LlmCall> {
        let r = crate::http::get(self.addr(), "/_calls");
        assert_eq!(r.status, 200, "GET /_calls: {}", r.text());
        let calls = r.json();
        let calls = calls.as_array().expect("/_calls answers a list");
        calls.iter().map(LlmCall::from_json).collect()
    }
}

/// A request as the upstream received it: what Envoy forwarded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LlmCall {
    pub method: String,
    /// With its query.
    pub path: String,
    /// By lower-cased name.
    pub headers: HashMap<String, String>,
    pub body: String,
}

impl LlmCall {
    fn from_json(call: &Value) -> LlmCall {
        let text = |field: &str| call[field].as_str().unwrap_or_default().to_string();
        let headers = call["headers"].as_object().map(|headers| {
            let pairs = headers.iter();
            let pairs = pairs.map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().into()));
            pairs.collect()
        });
        LlmCall {
            method: text("method"),
            path: text("path"),
            headers: headers.unwrap_or_default(),
            body: text("body"),
        }
    }

    /// The body as JSON; panics with the body when it is not.
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
}

/// The three APIs the upstream speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// OpenAI's `POST /v1/chat/completions`.
    ChatCompletions,
    /// OpenAI's `POST /v1/responses`.
    Responses,
    /// Anthropic's `POST /v1/messages`.
    Messages,
}

impl Api {
    pub const ALL: [Api; 3] = [Api::ChatCompletions, Api::Responses, Api::Messages];

    pub fn path(self) -> &'static str {
        match self {
            Api::ChatCompletions => "/v1/chat/completions",
            Api::Responses => "/v1/responses",
            Api::Messages => "/v1/messages",
        }
    }

    /// A small request body as clients send it; a chat completions stream asks for its usage
    /// (`stream_options.include_usage`), as the others report it unasked.
    pub fn body(self, stream: bool) -> String {
        let mut body = match self {
            Api::ChatCompletions => {
                serde_json::json!({"model": "test-model", "messages": [{"role": "user", "content": "hello"}]})
            }
            Api::Responses => serde_json::json!({"model": "test-model", "input": "hello"}),
            Api::Messages => {
                serde_json::json!({"model": "test-model", "max_tokens": 256, "messages": [{"role": "user", "content": "hello"}]})
            }
        };
        if stream {
            body["stream"] = true.into();
            if self == Api::ChatCompletions {
                body["stream_options"] = serde_json::json!({"include_usage": true});
            }
        }
        body.to_string()
    }
}

/// An answer as `post` read it.
#[derive(Debug, Clone)]
pub struct LlmResponse {
    pub status: u16,
    /// In order received; names lower-cased.
    pub headers: Vec<(String, String)>,
    /// The trailers after a chunked body's last chunk.
    pub trailers: Vec<(String, String)>,
    /// The body; past 1 MiB only its last 1 MiB (`bytes` counts it all).
    pub body: Vec<u8>,
    /// The body's length.
    pub bytes: u64,
    /// Whether the body arrived whole: false when the connection closed or broke before its
    /// end (a cut stream), or it took more than 120 s.
    pub complete: bool,
    /// From sending the request to the body's first byte.
    pub first_body_byte: Option<Duration>,
    /// From sending the request to the body's end, or to where it broke.
    pub elapsed: Duration,
}

impl LlmResponse {
    /// The first header with this (case-insensitive) name.
    pub fn header(&self, name: &str) -> Option<&str> {
        find_field(&self.headers, name)
    }

    /// The first trailer with this (case-insensitive) name.
    pub fn trailer(&self, name: &str) -> Option<&str> {
        find_field(&self.trailers, name)
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON; panics with the body when it is not.
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.text()))
    }

    /// The server-sent events of the body (of what it kept: the first may be a piece).
    pub fn events(&self) -> Vec<SseEvent> {
        sse_events(&self.text())
    }
}

fn find_field<'a>(fields: &'a [(String, String)], name: &str) -> Option<&'a str> {
    let name = name.to_ascii_lowercase();
    let found = fields.iter().find(|(n, _)| *n == name);
    found.map(|(_, v)| v.as_str())
}

/// One server-sent event: its `event:` name if it has one, and its `data:`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    pub event: Option<String>,
    pub data: String,
}

impl SseEvent {
    /// The data as JSON; panics with the data when it is not (OpenAI's `[DONE]` is not).
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.data).unwrap_or_else(|e| panic!("{e}: {}", self.data))
    }
}

/// The events of an event stream, in order: blocks separated by a blank line, each of `event:`
/// and `data:` lines (several data lines joined by newlines).
pub fn sse_events(text: &str) -> Vec<SseEvent> {
    let blocks = text.split("\n\n").filter(|b| !b.trim().is_empty());
    let events = blocks.map(|block| {
        let mut event = None;
        let mut data: Vec<&str> = Vec::new();
        for line in block.lines() {
            if let Some(name) = line.strip_prefix("event:") {
                event = Some(name.trim().to_string());
            } else if let Some(value) = line.strip_prefix("data:") {
                data.push(value.strip_prefix(' ').unwrap_or(value));
            }
        }
        let data = data.join("\n");
        SseEvent { event, data }
    });
    events.collect()
}

/// A `GET /slow?ms=<ms>` to `addr` with `headers`, on a thread of its own, which the upstream
/// answers after `ms`: its status when joined (0 when no answer came: Envoy died, say).
pub fn slow_in_flight(addr: SocketAddr, ms: u64, headers: &[(&str, &str)]) -> JoinHandle<u16> {
    let headers: Vec<(String, String)> = headers
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    std::thread::spawn(move || {
        let path = format!("/slow?ms={ms}");
        let headers: Vec<(&str, &[u8])> = headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_bytes()))
            .collect();
        crate::http::http_request(addr, "GET", &path, &headers).map_or(0, |r| r.status)
    })
}

/// `api`'s small request (`Api::body`) with `headers` to `addr` (an Envoy, or the upstream
/// itself); panics when no answer comes.
pub fn call(addr: SocketAddr, api: Api, stream: bool, headers: &[(&str, &str)]) -> LlmResponse {
    post(addr, api.path(), headers, &api.body(stream))
        .unwrap_or_else(|e| panic!("POST {}: {e}", api.path()))
}

/// POSTs a JSON `body` to `path` with `headers` on a fresh connection and reads the answer as
/// it comes, keeping at most 1 MiB of its body. `Err` when no answer head came (the connection
/// was refused, closed or reset first); a body that breaks off is `complete: false`.
pub fn post(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Result<LlmResponse, String> {
    post_bytes(addr, path, headers, body.as_bytes())
}

/// `post` with a body of any bytes (a byte-order mark, UTF-16).
pub fn post_bytes(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Result<LlmResponse, String> {
    let stream = TcpStream::connect_timeout(&addr, IO_TIMEOUT)
        .map_err(|e| format!("connect {addr}: {e}"))?;
    stream
        .set_read_timeout(Some(IO_TIMEOUT))
        .and_then(|()| stream.set_write_timeout(Some(IO_TIMEOUT)))
        .map_err(|e| e.to_string())?;
    let mut request = format!(
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n",
        body.len()
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    let mut request = request.into_bytes();
    request.extend_from_slice(body);
    let started = Instant::now();
    (&stream)
        .write_all(&request)
        .map_err(|e| format!("write: {e}"))?;
    let mut reader = Reader {
        inner: BufReader::with_capacity(64 * 1024, stream),
        deadline: started + CALL_DEADLINE,
    };
    let (status, headers) = reader.head().map_err(|e| format!("no answer: {e}"))?;
    let mut body = Body::new(started);
    let framing = Framing::of(&headers);
    let ended = match framing {
        Framing::Chunked => reader.chunked(&mut body),
        Framing::Length(n) => reader.copy(n, &mut body).map(|whole| (whole, Vec::new())),
        Framing::ToClose => reader.until_closed(&mut body).map(|()| (true, Vec::new())),
    };
    let (complete, trailers) = ended.unwrap_or((false, Vec::new()));
    Ok(body.into_response(status, headers, trailers, complete))
}

/// How an HTTP/1.1 body ends.
enum Framing {
    Chunked,
    Length(u64),
    ToClose,
}

impl Framing {
    fn of(headers: &[(String, String)]) -> Framing {
        let chunked = find_field(headers, "transfer-encoding")
            .is_some_and(|te| te.eq_ignore_ascii_case("chunked"));
        let length = find_field(headers, "content-length").and_then(|n| n.trim().parse().ok());
        match (chunked, length) {
            (true, _) => Framing::Chunked,
            (false, Some(n)) => Framing::Length(n),
            (false, None) => Framing::ToClose,
        }
    }
}

/// A body as it arrives: counted, its last 1 MiB kept.
struct Body {
    started: Instant,
    kept: Vec<u8>,
    bytes: u64,
    first: Option<Duration>,
}

impl Body {
    fn new(started: Instant) -> Body {
        Body {
            started,
            kept: Vec::new(),
            bytes: 0,
            first: None,
        }
    }

    fn push(&mut self, data: &[u8]) {
        if self.first.is_none() && !data.is_empty() {
            self.first = Some(self.started.elapsed());
        }
        self.bytes += data.len() as u64;
        self.kept.extend_from_slice(data);
        if self.kept.len() > 2 * KEPT_BODY {
            self.kept.drain(..self.kept.len() - KEPT_BODY);
        }
    }

    fn into_response(
        mut self,
        status: u16,
        headers: Vec<(String, String)>,
        trailers: Vec<(String, String)>,
        complete: bool,
    ) -> LlmResponse {
        let elapsed = self.started.elapsed();
        if self.kept.len() > KEPT_BODY {
            self.kept.drain(..self.kept.len() - KEPT_BODY);
        }
        LlmResponse {
            status,
            headers,
            trailers,
            body: self.kept,
            bytes: self.bytes,
            complete,
            first_body_byte: self.first,
            elapsed,
        }
    }
}

/// An answer's bytes as they come, under the deadline of the whole answer.
struct Reader {
    inner: BufReader<TcpStream>,
    deadline: Instant,
}

impl Reader {
    fn check_deadline(&self) -> io::Result<()> {
        if Instant::now() > self.deadline {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no end within {CALL_DEADLINE:?}"),
            ));
        }
        Ok(())
    }

    /// A line without its CRLF; `None` at the end of the stream.
    fn line(&mut self) -> io::Result<Option<String>> {
        self.check_deadline()?;
        let mut line = Vec::new();
        if self.inner.read_until(b'\n', &mut line)? == 0 {
            return Ok(None);
        }
        let line = String::from_utf8_lossy(&line);
        Ok(Some(line.trim_end_matches(['\r', '\n']).to_string()))
    }

    /// Header lines up to the empty line: names lower-cased, values trimmed.
    fn fields(&mut self) -> io::Result<Vec<(String, String)>> {
        let mut fields = Vec::new();
        loop {
            let line = self.line()?.ok_or(io::ErrorKind::UnexpectedEof)?;
            if line.is_empty() {
                return Ok(fields);
            }
            if let Some((name, value)) = line.split_once(':') {
                fields.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
            }
        }
    }

    /// The status line and headers.
    fn head(&mut self) -> io::Result<(u16, Vec<(String, String)>)> {
        let status_line = self.line()?.ok_or(io::ErrorKind::UnexpectedEof)?;
        let status = status_line.split(' ').nth(1).and_then(|s| s.parse().ok());
        let status = status.ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("status line {status_line:?}"),
            )
        })?;
        Ok((status, self.fields()?))
    }

    /// `n` bytes into `body`; false when the stream ended first.
    fn copy(&mut self, mut n: u64, body: &mut Body) -> io::Result<bool> {
        while n > 0 {
            self.check_deadline()?;
            let buf = self.inner.fill_buf()?;
            if buf.is_empty() {
                return Ok(false);
            }
            let take = buf.len().min(usize::try_from(n).unwrap_or(usize::MAX));
            body.push(&buf[..take]);
            self.inner.consume(take);
            n -= take as u64;
        }
        Ok(true)
    }

    /// A chunked body into `body`: whether its last chunk came, and the trailers after it.
    fn chunked(&mut self, body: &mut Body) -> io::Result<(bool, Vec<(String, String)>)> {
        loop {
            let Some(size_line) = self.line()? else {
                return Ok((false, Vec::new()));
            };
            let size_hex = size_line.split(';').next().unwrap_or_default().trim();
            let size = u64::from_str_radix(size_hex, 16).map_err(|_| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("chunk size {size_hex:?}"),
                )
            })?;
            if size == 0 {
                return Ok((true, self.fields()?));
            }
            if !self.copy(size, body)? || self.line()?.is_none() {
                return Ok((false, Vec::new()));
            }
        }
    }

    /// Everything until the connection closes.
    fn until_closed(&mut self, body: &mut Body) -> io::Result<()> {
        while self.copy(64 * 1024, body)? {}
        Ok(())
    }
}

/// One chat completion as the openai SDK saw it (`python/openai_client.py`).
#[derive(Debug, Clone)]
pub struct OpenAiCall {
    /// The HTTP status, 429 included; 0 when no answer came.
    pub status: u16,
    /// The SDK's exception: `RateLimitError` for a 429, `InternalServerError` for a 5xx,
    /// `APIConnectionError` for a call that got no answer or whose stream broke; `None` when
    /// the call succeeded.
    pub error_type: Option<String>,
    /// The response headers (`retry-after`, `x-ratelimit-*`...), by lower-cased name.
    pub headers: HashMap<String, String>,
    /// The usage the SDK read (`prompt_tokens`, `completion_tokens`, `total_tokens`...).
    pub usage: Option<Value>,
    /// The text it read, streamed or not.
    pub content: String,
    /// A stream's first chunk out of the SDK, from the call.
    pub first_chunk: Option<Duration>,
    pub elapsed: Duration,
    /// An error answer's body (JSON as the SDK parsed it), or why the call failed.
    pub error: Option<Value>,
    /// The message of the SDK's exception for an error answer.
    pub message: Option<String>,
}

impl OpenAiCall {
    fn from_json(v: &Value) -> OpenAiCall {
        let millis = |field: &str| {
            v[field]
                .as_f64()
                .map(|ms| Duration::from_secs_f64(ms / 1e3))
        };
        let headers = v["headers"].as_object().map(|headers| {
            let pairs = headers.iter();
            let pairs = pairs.map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().into()));
            pairs.collect()
        });
        let present = |field: &str| Some(v[field].clone()).filter(|v| !v.is_null());
        OpenAiCall {
            status: v["status"]
                .as_u64()
                .and_then(|s| s.try_into().ok())
                .unwrap_or_default(),
            error_type: v["error_type"].as_str().map(String::from),
            headers: headers.unwrap_or_default(),
            usage: present("usage"),
            content: v["content"].as_str().unwrap_or_default().into(),
            first_chunk: millis("first_chunk_ms"),
            elapsed: millis("elapsed_ms").unwrap_or_default(),
            error: present("error"),
            message: v["message"].as_str().map(String::from),
        }
    }
}

/// `n` chat completions, one after the other, through the official openai SDK at
/// `http://{base}/v1`, each with `headers`; streamed (with `stream_options.include_usage`)
/// when `stream`. The SDK never retries (`max_retries=0`), so each 429 is one call.
pub fn openai_calls(
    base: SocketAddr,
    n: usize,
    stream: bool,
    headers: &[(&str, &str)],
) -> Vec<OpenAiCall> {
    sdk_calls("openai", &format!("http://{base}/v1"), n, stream, headers)
}

/// `n` chat completions through the official openai SDK as `openai_calls` makes them, each
/// asking for `model` and, when given, at most `max_tokens` of output.
pub fn openai_calls_of(
    base: SocketAddr,
    n: usize,
    stream: bool,
    (model, max_tokens): (&str, Option<u64>),
    headers: &[(&str, &str)],
) -> Vec<OpenAiCall> {
    // Passed as `--NAME=VALUE` among the headers' `NAME=VALUE`: the script tells them apart.
    let max_tokens = max_tokens.map(|n| n.to_string());
    let mut all = vec![("--model", model)];
    all.extend(max_tokens.as_deref().map(|n| ("--max-tokens", n)));
    all.extend_from_slice(headers);
    openai_calls(base, n, stream, &all)
}

/// `n` messages through the official anthropic SDK (`python/anthropic_client.py`) at `base`,
/// one after the other, in the shape `openai_calls` gives.
pub fn anthropic_calls(
    base: SocketAddr,
    n: usize,
    stream: bool,
    headers: &[(&str, &str)],
) -> Vec<OpenAiCall> {
    sdk_calls("anthropic", &format!("http://{base}"), n, stream, headers)
}

fn sdk_calls(
    sdk: &str,
    base_url: &str,
    n: usize,
    stream: bool,
    headers: &[(&str, &str)],
) -> Vec<OpenAiCall> {
    let mode = if stream { "stream" } else { "json" };
    let args = [base_url.to_string(), n.to_string(), mode.to_string()];
    let pairs = headers.iter().map(|(k, v)| format!("{k}={v}"));
    let limit = CLIENT_START + CLIENT_CALL * u32::try_from(n).unwrap_or(u32::MAX);
    let script = Script::with_package(&format!("{sdk}_client.py"), sdk, sdk);
    let lines = script.run(args.into_iter().chain(pairs), limit);
    let calls: Vec<OpenAiCall> = lines
        .iter()
        .map(|line| {
            let v: Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("the {sdk} client printed {line:?}: {e}"));
            OpenAiCall::from_json(&v)
        })
        .collect();
    assert_eq!(calls.len(), n, "calls made");
    calls
}

#[cfg(test)]
mod tests {
    use super::sse_events;

    #[test]
    fn events_with_and_without_names() {
        let text = "event: ping\ndata: {}\n\ndata: [DONE]\n\n";
        let events = sse_events(text);
        assert_eq!(events.len(), 2);
        assert_eq!(events[0].event.as_deref(), Some("ping"));
        assert_eq!(events[1].event, None);
        assert_eq!(events[1].data, "[DONE]");
    }
}
