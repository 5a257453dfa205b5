//! A blocking HTTP/1.1 client for Envoy's listener and admin, and for `sluice-service`.
//!
//! A response is read until it is complete, not to EOF: after `connection: close` Envoy waits up
//! to its delayed_close_timeout (1 s) before closing, which would make every request take a
//! second.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// An HTTP response.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    /// In order received; names lower-cased, values as sent.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    /// The first header with this (case-insensitive) name.
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The body as text (lossy UTF-8).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON; panics with the body when it is not.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.text()))
    }
}

/// One request without a body on a fresh connection with `Connection: close`.
pub fn http_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &[u8])],
) -> Result<Response, String> {
    Connection::open(addr)?.request(method, path, headers)
}

/// GET `path`, which must get a response.
pub fn get(addr: SocketAddr, path: &str) -> Response {
    http_request(addr, "GET", path, &[]).unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

/// `method` `path` with a body of `content_type`, which must get a response.
pub fn send_body(
    addr: SocketAddr,
    method: &str,
    path: &str,
    content_type: &str,
    body: &[u8],
) -> Response {
    let headers: &[(&str, &[u8])] = &[("content-type", content_type.as_bytes())];
    let mut connection = Connection::open(addr).unwrap_or_else(|e| panic!("{e}"));
    let request = request_bytes(addr, method, path, headers, body, "close");
    read_response(&mut connection.stream, &request, method)
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
}

/// `method` on `path` with these headers (a host is added) and `body`.
pub fn send_with(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &[u8])],
    body: &[u8],
) -> Response {
    let mut connection = Connection::open(addr).unwrap_or_else(|e| panic!("{e}"));
    let request = request_bytes(addr, method, path, headers, body, "close");
    read_response(&mut connection.stream, &request, method)
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
}

/// POST a JSON body to `path`.
pub fn post_json(addr: SocketAddr, path: &str, body: &str) -> Response {
    send_body(addr, "POST", path, "application/json", body.as_bytes())
}

/// Sends `raw` bytes as they are and reads the response. The server may answer (and close)
/// before reading everything, e.g. an oversize body: a failed write is not an error.
pub fn send_raw(addr: SocketAddr, raw: &[u8]) -> Response {
    let mut connection = Connection::open(addr).unwrap_or_else(|e| panic!("{e}"));
    let _ = connection.stream.write_all(raw);
    read_response(&mut connection.stream, &[], "").unwrap_or_else(|e| panic!("{e}"))
}

/// A connection opened ahead of its one request: threads that open theirs first and then send
/// together race inside the server, not in `connect`. `send` instead keeps it open for any
/// number of requests, one at a time.
pub struct Connection {
    stream: TcpStream,
    addr: SocketAddr,
}

impl Connection {
    pub fn open(addr: SocketAddr) -> Result<Connection, String> {
        let stream = TcpStream::connect_timeout(&addr, IO_TIMEOUT)
            .map_err(|e| format!("connect {addr}: {e}"))?;
        stream
            .set_read_timeout(Some(IO_TIMEOUT))
            .map_err(|e| e.to_string())?;
        stream
            .set_write_timeout(Some(IO_TIMEOUT))
            .map_err(|e| e.to_string())?;
        Ok(Connection { stream, addr })
    }

    /// Sends one request with `Connection: close` and reads its response.
    pub fn request(
        mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &[u8])],
    ) -> Result<Response, String> {
        self.exchange(method, path, headers, "close")
    }

    /// Sends one request with `Connection: keep-alive` and reads its response, leaving the
    /// connection open for the next: all requests sent on it reach the Envoy worker that
    /// accepted it.
    pub fn send(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &[u8])],
    ) -> Result<Response, String> {
        self.exchange(method, path, headers, "keep-alive")
    }

    fn exchange(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &[u8])],
        connection: &str,
    ) -> Result<Response, String> {
        let req = request_bytes(self.addr, method, path, headers, &[], connection);
        read_response(&mut self.stream, &req, method)
    }
}

/// An HTTP/1.1 request; `connection` is the `Connection` header's value. A body gets its
/// `content-length`.
fn request_bytes(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &[u8])],
    body: &[u8],
    connection: &str,
) -> Vec<u8> {
    let mut req = format!("{method} {path} HTTP/1.1\r\n").into_bytes();
    if !headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("host")) {
        req.extend_from_slice(format!("host: {addr}\r\n").as_bytes());
    }
    for (name, value) in headers {
        req.extend_from_slice(name.as_bytes());
        req.extend_from_slice(b": ");
        req.extend_from_slice(value);
        req.extend_from_slice(b"\r\n");
    }
    if !body.is_empty() {
        req.extend_from_slice(format!("content-length: {}\r\n", body.len()).as_bytes());
    }
    req.extend_from_slice(format!("connection: {connection}\r\n\r\n").as_bytes());
    req.extend_from_slice(body);
    req
}

/// Writes `req` and reads its response. Bytes after the response would be dropped, but with
/// one request in flight at a time there are none: a keep-alive connection stays usable.
fn read_response(stream: &mut TcpStream, req: &[u8], method: &str) -> Result<Response, String> {
    stream.write_all(req).map_err(|e| format!("write: {e}"))?;
    let mut raw = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        let n = stream.read(&mut buf).map_err(|e| format!("read: {e}"))?;
        raw.extend_from_slice(&buf[..n]);
        let eof = n == 0;
        if let Some(response) = parse_response(&raw, eof, method == "HEAD")? {
            return Ok(response);
        }
        if eof {
            return Err(format!(
                "connection closed before a complete response: {:?}",
                String::from_utf8_lossy(&raw)
            ));
        }
    }
}

/// `Ok(None)` while `raw` does not hold a complete response yet.
fn parse_response(raw: &[u8], eof: bool, head_only: bool) -> Result<Option<Response>, String> {
    let Some(head_end) = find(raw, b"\r\n\r\n") else {
        return Ok(None);
    };
    let head = String::from_utf8_lossy(&raw[..head_end]).into_owned();
    let rest = &raw[head_end + 4..];

    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status: u16 = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad status line {status_line:?}"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let mut response = Response {
        status,
        headers,
        body: Vec::new(),
    };

    let chunked = response
        .header("transfer-encoding")
        .is_some_and(|te| te.eq_ignore_ascii_case("chunked"));
    let body = if head_only || status == 204 || status == 304 {
        Some(Vec::new())
    } else if chunked {
        decode_chunked(rest)?
    } else if let Some(len) = response.header("content-length") {
        let len: usize = len
            .parse()
            .map_err(|_| format!("bad content-length {len:?}"))?;
        rest.get(..len).map(<[u8]>::to_vec)
    } else if eof {
        Some(rest.to_vec())
    } else {
        None
    };
    Ok(body.map(|body| {
        response.body = body;
        response
    }))
}

/// The decoded body, or `Ok(None)` while the last chunk has not arrived.
fn decode_chunked(mut data: &[u8]) -> Result<Option<Vec<u8>>, String> {
    let mut body = Vec::new();
    loop {
        let Some(line_end) = find(data, b"\r\n") else {
            return Ok(None);
        };
        let size_line = String::from_utf8_lossy(&data[..line_end]);
        let size_hex = size_line.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_hex, 16)
            .map_err(|_| format!("bad chunk size {size_hex:?}"))?;
        data = &data[line_end + 2..];
        if size == 0 {
            // Complete once the (ignored) trailer section ends with an empty line.
            let done = data.starts_with(b"\r\n") || find(data, b"\r\n\r\n").is_some();
            return Ok(done.then_some(body));
        }
        let (Some(chunk), Some(after)) = (data.get(..size), data.get(size + 2..)) else {
            return Ok(None);
        };
        body.extend_from_slice(chunk);
        data = after;
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}
