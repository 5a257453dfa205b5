//! A minimal blocking RESP2 client: enough to inspect Redis from tests.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Status(String),
    Error(String),
    Int(i64),
    Bulk(Option<String>),
    Array(Vec<Reply>),
}

impl Reply {
    pub fn int(&self) -> i64 {
        match self {
            Reply::Int(n) => *n,
            other => panic!("expected an integer, got {other:?}"),
        }
    }

    pub fn text(&self) -> String {
        match self {
            Reply::Status(s) | Reply::Bulk(Some(s)) => s.clone(),
            other => panic!("expected text, got {other:?}"),
        }
    }

    pub fn texts(&self) -> Vec<String> {
        match self {
            Reply::Array(items) => items.iter().map(Reply::text).collect(),
            other => panic!("expected an array, got {other:?}"),
        }
    }

    pub fn ints(&self) -> Vec<i64> {
        match self {
            Reply::Array(items) => items.iter().map(Reply::int).collect(),
            other => panic!("expected an array, got {other:?}"),
        }
    }
}

pub struct Resp {
    reader: BufReader<TcpStream>,
}

impl Resp {
    pub fn connect(port: u16) -> std::io::Result<Resp> {
        let stream = TcpStream::connect(("127.0.0.1", port))?;
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        stream.set_write_timeout(Some(Duration::from_secs(5)))?;
        Ok(Resp {
            reader: BufReader::new(stream),
        })
    }

    pub fn try_cmd(&mut self, args: &[&str]) -> std::io::Result<Reply> {
        let mut packet = format!("*{}\r\n", args.len()).into_bytes();
        for arg in args {
            packet.extend_from_slice(format!("${}\r\n{arg}\r\n", arg.len()).as_bytes());
        }
        self.reader.get_mut().write_all(&packet)?;
        self.read_reply()
    }

    pub fn cmd(&mut self, args: &[&str]) -> Reply {
        self.try_cmd(args).unwrap()
    }

    fn read_reply(&mut self) -> std::io::Result<Reply> {
        let mut line = String::new();
        self.reader.read_line(&mut line)?;
        let line = line.trim_end_matches("\r\n");
        let (kind, rest) = line.split_at(1.min(line.len()));
        let number = || rest.parse::<i64>().unwrap_or(-1);
        Ok(match kind {
            "+" => Reply::Status(rest.to_string()),
            "-" => Reply::Error(rest.to_string()),
            ":" => Reply::Int(number()),
            "$" if number() < 0 => Reply::Bulk(None),
            "$" => {
                let mut data = vec![0; number() as usize + 2];
                self.reader.read_exact(&mut data)?;
                data.truncate(data.len() - 2);
                Reply::Bulk(Some(String::from_utf8_lossy(&data).into_owned()))
            }
            "*" => {
                let items = (0..number().max(0)).map(|_| self.read_reply());
                Reply::Array(items.collect::<std::io::Result<_>>()?)
            }
            _ => {
                return Err(std::io::Error::other(format!(
                    "unexpected RESP line {line:?}"
                )))
            }
        })
    }
}
