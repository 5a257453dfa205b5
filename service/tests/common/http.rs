//! A blocking HTTP/1.1 client, one request per connection (`connection: close`).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

#[derive(Debug)]
pub struct HttpResponse {
    pub status: u16,
    pub head: String,
    pub body: String,
}

impl HttpResponse {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }

    /// Asserts a 400 whose detail starts with `detail_prefix` (the field at fault).
    pub fn assert_bad_request(&self, detail_prefix: &str) {
        assert_eq!(self.status, 400, "{self:?}");
        let json = self.json();
        assert_eq!(json["error"], "bad_request", "{self:?}");
        let detail = json["detail"].as_str().unwrap();
        assert!(
            detail.starts_with(detail_prefix),
            "detail {detail:?} should start with {detail_prefix:?}"
        );
    }
}

/// Sends `raw` bytes as they are and reads the whole response.
pub fn send_raw(addr: SocketAddr, raw: &[u8]) -> HttpResponse {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream
        .set_write_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    // The server may answer (and close) before reading everything, e.g. for an oversize body.
    let _ = stream.write_all(raw);
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response);
    parse(&String::from_utf8_lossy(&response))
}

fn parse(response: &str) -> HttpResponse {
    let (head, body) = response
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no response: {response:?}"));
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap();
    HttpResponse {
        status,
        head: head.to_string(),
        body: body.to_string(),
    }
}

pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    content_type: &str,
    body: &str,
) -> HttpResponse {
    let raw = format!(
        "{method} {path} HTTP/1.1\r\nhost: sluice\r\nconnection: close\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    send_raw(addr, raw.as_bytes())
}

pub fn post_check(addr: SocketAddr, body: &str) -> HttpResponse {
    request(addr, "POST", "/v1/check", "application/json", body)
}

pub fn get(addr: SocketAddr, path: &str) -> HttpResponse {
    let raw = format!("GET {path} HTTP/1.1\r\nhost: sluice\r\nconnection: close\r\n\r\n");
    send_raw(addr, raw.as_bytes())
}
