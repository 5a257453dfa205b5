//! A small blocking HTTP/1.1 client for the admin API: one request per connection, JSON in and
//! out, plain `http://` (reach a remote service through `kubectl port-forward` or the mesh).
//! An answer that is not 2xx is an error carrying the service's `detail`.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use serde_json::Value;

/// How long a call may take, connecting included.
const TIMEOUT: Duration = Duration::from_secs(10);
/// The largest answer read.
const MAX_ANSWER_BYTES: u64 = 16 << 20;

pub struct Client {
    host: String,
    token: String,
}

impl Client {
    /// `service` is `http://host:port` (a trailing `/` allowed).
    pub fn new(service: &str, token: String) -> Result<Client, String> {
        let host = service
            .strip_prefix("http://")
            .ok_or_else(|| format!("--service {service:?}: must start with http://"))?
            .trim_end_matches('/');
        if host.is_empty() || host.contains('/') {
            return Err(format!("--service {service:?}: must be http://host:port"));
        }
        if token.is_empty() {
            return Err("the token is empty".to_string());
        }
        Ok(Client {
            host: host.to_string(),
            token,
        })
    }

    pub fn get(&self, path: &str) -> Result<Value, String> {
        self.call("GET", path, None)
    }

    pub fn post(&self, path: &str, body: &Value) -> Result<Value, String> {
        self.call("POST", path, Some(body))
    }

    fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value, String> {
        let address = (self.host.to_socket_addrs())
            .map_err(|e| format!("{}: {e}", self.host))?
            .next()
            .ok_or_else(|| format!("{}: no address", self.host))?;
        let mut stream = TcpStream::connect_timeout(&address, TIMEOUT)
            .map_err(|e| format!("{}: {e}", self.host))?;
        let io = |e: std::io::Error| format!("{}: {e}", self.host);
        stream.set_read_timeout(Some(TIMEOUT)).map_err(io)?;
        stream.set_write_timeout(Some(TIMEOUT)).map_err(io)?;
        let body = body.map(Value::to_string).unwrap_or_default();
        let head = format!(
            "{method} {path} HTTP/1.1\r\nhost: {}\r\nauthorization: Bearer {}\r\n\
             content-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            self.host,
            self.token,
            body.len()
        );
        stream.write_all(head.as_bytes()).map_err(io)?;
        stream.write_all(body.as_bytes()).map_err(io)?;
        let mut answer = Vec::new();
        (stream.take(MAX_ANSWER_BYTES))
            .read_to_end(&mut answer)
            .map_err(io)?;
        parse(&answer)
    }
}

/// The JSON of a 2xx answer, else an error of its status and `detail`.
fn parse(answer: &[u8]) -> Result<Value, String> {
    let text = String::from_utf8_lossy(answer);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| "the service's answer has no end of headers".to_string())?;
    let status: u16 = (head.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| "the service's answer has no status".to_string())?;
    let json: Value = serde_json::from_str(body).unwrap_or(Value::Null);
    if (200..300).contains(&status) {
        return Ok(json);
    }
    let detail = json["detail"].as_str().unwrap_or("").to_string();
    let error = json["error"].as_str().unwrap_or("error").to_string();
    Err(format!("{status} {error}: {detail}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_that_is_not_2xx_is_an_error_naming_the_field() {
        let answer = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 2\r\n\r\n{\"error\":\"bad_request\",\"detail\":\"reason: required\"}";
        assert_eq!(
            parse(answer).unwrap_err(),
            "400 bad_request: reason: required"
        );
        let ok = b"HTTP/1.1 200 OK\r\n\r\n{\"a\":1}";
        assert_eq!(parse(ok).unwrap()["a"], 1);
    }

    #[test]
    fn the_service_is_an_http_address() {
        assert!(Client::new("https://x:1", "t".into()).is_err());
        assert!(Client::new("http://x:1/admin", "t".into()).is_err());
        assert!(Client::new("http://127.0.0.1:8080/", "t".into()).is_ok());
    }
}
