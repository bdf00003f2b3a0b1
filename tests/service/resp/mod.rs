//! The Redis-protocol listener, tested with clients nobody here wrote
//! (redis-cli, the `redis` crate, redis-py running the article's code)
//! and against a real redis-server: one table of cases, run against both.

use std::time::Duration;

use bytes::Buf;
use bytes::BytesMut;
use dedupd::clock::Clock;
use dedupd::clock::ManualClock;
use dedupd::clock::SystemClock;
use dedupd::config::Loaded;
use tokio::io::AsyncRead;
use tokio::io::AsyncReadExt;
use tokio::io::AsyncWrite;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::net::UnixStream;

use crate::support::app::TestApp;
use crate::support::app::spawn_app_at;
mod cases;
mod clients;
mod conformance;
mod hostile;
mod listener;

/// Settings tweak: the RESP listener on a free loopback port.
pub fn with_resp(loaded: &mut Loaded) {
    loaded.settings.resp.listen = Some("127.0.0.1:0".parse().unwrap());
}

/// An app with the RESP listener, its clock at `start_ms`, after `tweak`.
pub async fn spawn_resp_app_at(start_ms: u64, tweak: impl FnOnce(&mut Loaded)) -> TestApp {
    spawn_app_at(ManualClock::new(start_ms), |l| {
        with_resp(l);
        tweak(l);
    })
    .await
}

/// An app with the RESP listener on the manual test clock.
pub async fn spawn_resp_app() -> TestApp {
    spawn_resp_app_at(crate::support::app::T0, |_| {}).await
}

/// The app's RESP address.
pub fn resp_addr(app: &TestApp) -> String {
    format!("127.0.0.1:{}", app.resp_port.expect("resp listener on"))
}

/// Now on the system clock, Unix ms.
pub fn system_now_ms() -> u64 {
    SystemClock.now_ms()
}

/// A byte stream to a server.
pub trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// A raw connection: sends commands as RESP arrays of bulk strings and
/// reads each reply as the exact bytes the server sent.
pub struct Raw {
    stream: Box<dyn Io>,
    buf: BytesMut,
    /// Whether replies are RESP3 (after a successful `HELLO 3`).
    pub resp3: bool,
}

impl Raw {
    /// Connects to `addr`: host:port, or `unix:PATH`.
    pub async fn connect(addr: &str) -> Raw {
        let stream: Box<dyn Io> = match addr.strip_prefix("unix:") {
            Some(path) => Box::new(UnixStream::connect(path).await.expect("connect")),
            None => {
                let s = TcpStream::connect(addr).await.expect("connect");
                s.set_nodelay(true).unwrap();
                Box::new(s)
            }
        };
        Raw {
            stream,
            buf: BytesMut::new(),
            resp3: false,
        }
    }

    /// Encodes `args` as one request.
    pub fn encode(args: &[Vec<u8>]) -> Vec<u8> {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            out.extend_from_slice(a);
            out.extend_from_slice(b"\r\n");
        }
        out
    }

    /// Sends bytes as they are. A failure (the server went away) shows as
    /// the next reply's `None`.
    pub async fn send_raw(&mut self, bytes: &[u8]) {
        let _ = self.stream.write_all(bytes).await;
    }

    /// Sends one command.
    pub async fn send(&mut self, args: &[Vec<u8>]) {
        self.send_raw(&Self::encode(args)).await;
    }

    /// Reads one reply's bytes; `None` when the server closed the
    /// connection first (or it broke).
    pub async fn reply(&mut self) -> Option<Vec<u8>> {
        loop {
            let decoded = if self.resp3 {
                redis_protocol::resp3::decode::complete::decode_range(&self.buf)
                    .map(|r| r.map(|(_, n)| n))
            } else {
                redis_protocol::resp2::decode::decode_range(&self.buf).map(|r| r.map(|(_, n)| n))
            };
            if let Some(n) = decoded.expect("a well-formed reply") {
                let bytes = self.buf[..n].to_vec();
                self.buf.advance(n);
                return Some(bytes);
            }
            let read =
                tokio::time::timeout(Duration::from_secs(30), self.stream.read_buf(&mut self.buf))
                    .await
                    .expect("a reply within 30 s")
                    .unwrap_or(0);
            if read == 0 {
                return None;
            }
        }
    }

    /// Sends one command and reads its reply (switching to RESP3 for the
    /// reply of a `HELLO 3`, back to RESP2 after `RESET`).
    pub async fn call(&mut self, args: &[Vec<u8>]) -> Option<Vec<u8>> {
        self.send(args).await;
        let name = args.first().map(|a| a.to_ascii_uppercase());
        let hello = (name.as_deref() == Some(b"HELLO"))
            .then(|| args.get(1))
            .flatten()
            .filter(|v| *v == b"2" || *v == b"3");
        let was = self.resp3;
        if let Some(v) = hello {
            self.resp3 = v == b"3";
        }
        let reply = self.reply().await;
        if hello.is_some() && reply.as_ref().is_some_and(|r| r.starts_with(b"-")) {
            self.resp3 = was;
        }
        if name.as_deref() == Some(b"RESET") {
            self.resp3 = false;
        }
        reply
    }

    /// `call` with words split on spaces.
    pub async fn cmd(&mut self, line: &str) -> Vec<u8> {
        let args: Vec<Vec<u8>> = line.split(' ').map(|w| w.as_bytes().to_vec()).collect();
        self.call(&args).await.expect("a reply")
    }
}

/// A reply's bytes as text, for messages.
pub fn show(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).replace("\r\n", "\\r\\n")
}
