//! Replies, and their encoding in the connection's protocol (RESP2 or
//! RESP3) by `redis-protocol`'s encoders.

use bytes::{Bytes, BytesMut};
use redis_protocol::resp2::types::BytesFrame as Frame2;
use redis_protocol::resp3::types::{BytesFrame as Frame3, FrameMap};

/// The protocol a connection speaks; `HELLO 3` switches to RESP3.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// RESP2, every connection's start.
    Resp2,
    Resp3,
}

impl Protocol {
    /// The number `HELLO` names it by.
    pub fn number(self) -> i64 {
        match self {
            Protocol::Resp2 => 2,
            Protocol::Resp3 => 3,
        }
    }
}

/// One reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// A status such as `OK`, `PONG`, `RESET`.
    Status(&'static str),
    /// A binary-safe string.
    Bulk(Bytes),
    /// Nothing: a nil bulk string in RESP2, `_` in RESP3.
    Null,
    Int(i64),
    /// An error; the text starts with its code (`ERR`, `NOAUTH`, …).
    Error(String),
    Array(Vec<Reply>),
    /// A map: a map in RESP3, a flat key-value array in RESP2.
    Map(Vec<(Reply, Reply)>),
}

impl Reply {
    /// `+OK`.
    pub const OK: Reply = Reply::Status("OK");

    /// An `ERR …` error.
    pub fn err(message: impl std::fmt::Display) -> Reply {
        Reply::Error(format!("ERR {message}"))
    }

    /// A bulk string of text.
    pub fn text(s: impl Into<String>) -> Reply {
        Reply::Bulk(Bytes::from(s.into()))
    }

    /// Appends the encoded reply to `out`.
    pub fn encode(self, protocol: Protocol, out: &mut BytesMut) {
        // Encoding a frame built here cannot fail: the buffer grows first.
        let _ = match protocol {
            Protocol::Resp2 => {
                redis_protocol::resp2::encode::extend_encode(out, &self.into_resp2(), false)
            }
            Protocol::Resp3 => redis_protocol::resp3::encode::complete::extend_encode(
                out,
                &self.into_resp3(),
                false,
            ),
        };
    }

    fn into_resp2(self) -> Frame2 {
        match self {
            Reply::Status(s) => Frame2::SimpleString(Bytes::from_static(s.as_bytes())),
            Reply::Bulk(b) => Frame2::BulkString(b),
            Reply::Null => Frame2::Null,
            Reply::Int(i) => Frame2::Integer(i),
            Reply::Error(e) => Frame2::Error(one_line(e).into()),
            Reply::Array(items) => Frame2::Array(items.into_iter().map(Self::into_resp2).collect()),
            Reply::Map(pairs) => Frame2::Array(
                pairs
                    .into_iter()
                    .flat_map(|(k, v)| [k.into_resp2(), v.into_resp2()])
                    .collect(),
            ),
        }
    }

    fn into_resp3(self) -> Frame3 {
        match self {
            Reply::Status(s) => Frame3::SimpleString {
                data: Bytes::from_static(s.as_bytes()),
                attributes: None,
            },
            Reply::Bulk(data) => Frame3::BlobString {
                data,
                attributes: None,
            },
            Reply::Null => Frame3::Null,
            Reply::Int(data) => Frame3::Number {
                data,
                attributes: None,
            },
            Reply::Error(e) => Frame3::SimpleError {
                data: one_line(e).into(),
                attributes: None,
            },
            Reply::Array(items) => Frame3::Array {
                data: items.into_iter().map(Self::into_resp3).collect(),
                attributes: None,
            },
            Reply::Map(pairs) => {
                let mut data = FrameMap::with_capacity(pairs.len());
                for (k, v) in pairs {
                    data.insert(k.into_resp3(), v.into_resp3());
                }
                Frame3::Map {
                    data,
                    attributes: None,
                }
            }
        }
    }
}

/// An error travels on one line: Redis turns line breaks into spaces.
fn one_line(mut s: String) -> String {
    if s.contains(['\r', '\n']) {
        s = s.replace(['\r', '\n'], " ");
    }
    s
}
