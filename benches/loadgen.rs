//! One closed-loop load generator for both sides of the Redis comparison:
//! `wrk` drives dedupd's claims and `redis-benchmark` drives Redis, and the
//! two tools differ in what they cost the shared cores and in what they
//! count as latency. This one sends dedupd's claim over HTTP/1.1 and
//! Redis's `SET k:<random> processing NX EX 300` over RESP from the same
//! loop: N connections, each sending one request and reading the whole
//! answer before the next, for a fixed time after a warm-up.
//!
//! ```sh
//! cargo bench --bench loadgen -- http-claim 127.0.0.1:8080 64 10
//! cargo bench --bench loadgen -- resp-set 127.0.0.1:6379 64 10
//! cargo bench --bench loadgen -- http-healthz 127.0.0.1:8080 64 10
//! cargo bench --bench loadgen -- http-apply 127.0.0.1:8080 64 10
//! cargo bench --bench loadgen -- http-claim-extend-release 127.0.0.1:8080 64 10
//! ```
//!
//! The last two show the other writes (`apply`, `extend`, `release`) on
//! the claims' path; `done` is in `claims_vs_redis.sh`'s `wrk` mix.
//!
//! Arguments: KIND ADDRESS CONNECTIONS SECONDS [THREADS (default 2)]
//! [WARM-UP SECONDS (default 1)]. Prints one line:
//! `RESULT kind=.. conns=.. requests=.. rps=.. p50_ms=.. p90_ms=.. p99_ms=.. p999_ms=.. max_ms=.. p99co_ms=.. errors=..`
//! (`errors`: answers that were not 2xx, `+OK` or a nil; the run stops at
//! the first broken connection).
//!
//! The percentiles are of the latencies as measured. `p99co_ms` is the p99
//! after `wrk`'s correction for coordinated omission (wrk 4's
//! `stats_correct`), which `wrk` applies to every figure it prints and
//! `redis-benchmark` does not: with `interval` the mean time between one
//! connection's requests (run time ÷ requests per connection), each
//! latency `L` of at least `2 × interval` also counts as `L − interval`,
//! `L − 2 × interval`, … down to `interval` — the requests an open-loop
//! client, sending at the mean rate, would have seen delayed behind it. A
//! stall of the whole server for `S` then weighs `S ÷ interval` times per
//! connection instead of once: two 100 ms pauses of the server (`kill
//! -STOP`) in a 10 s run at 256 connections took `wrk`'s p99 of `GET
//! /healthz` from 7.8 ms to 51.9 ms, this client's measured p99 from 6.8
//! to 7.4 ms and its `p99co_ms` from 7.0 to 48.2 ms.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long a request may go unanswered before the run fails.
const ANSWER_WITHIN: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// `POST /v1/claims/<unique key>`, empty body; 201 expected.
    HttpClaim,
    /// `GET /healthz`: no store work (the floor).
    HttpHealthz,
    /// `SET k:<12 random digits> processing NX EX 300`.
    RespSet,
    /// `POST /v1/streams/<unique stream>/apply` of one event: the
    /// applied-events table and a stream head written; 200 expected.
    HttpApply,
    /// The recipe's counterpart of `apply` on Redis: one Lua script
    /// (`EVALSHA`, loaded once per connection) that records the event id
    /// with `SET NX EX` and moves the stream's head with `SET EX` when the
    /// event is newer, reading the head first. A new stream and event each
    /// time, as [`Kind::HttpApply`].
    RespApply,
    /// A claim's whole life on each connection, one request at a time:
    /// `POST /v1/claims/<unique key>` (201), `POST .../extend` with its
    /// token (200), `DELETE` with its token (204). Every request counts.
    HttpCycle,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::HttpClaim => "http-claim",
            Kind::HttpHealthz => "http-healthz",
            Kind::RespSet => "resp-set",
            Kind::HttpApply => "http-apply",
            Kind::RespApply => "resp-apply",
            Kind::HttpCycle => "http-claim-extend-release",
        }
    }
}

/// What a connection's next request depends on from the answers before:
/// where a [`Kind::HttpCycle`] connection is in its claim's life, or the
/// script a [`Kind::RespApply`] connection loaded.
#[derive(Debug, Default)]
enum Step {
    /// Next: a new claim.
    #[default]
    Claim,
    /// Next: extend the claim of request `n` with this token.
    Extend(u64, String),
    /// Next: release it.
    Release(u64, String),
    /// [`Kind::RespApply`]: the loaded script's SHA1.
    Script(String),
}

#[derive(Debug)]
struct Args {
    kind: Kind,
    addr: SocketAddr,
    conns: usize,
    seconds: f64,
    threads: usize,
    warmup: f64,
}

fn parse_args() -> Result<Args, String> {
    // `cargo bench` adds `--bench`.
    let a: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let usage = "usage: loadgen KIND ADDRESS CONNECTIONS SECONDS [THREADS] [WARM-UP SECONDS]; KIND: http-claim | http-healthz | resp-set | http-apply | resp-apply | http-claim-extend-release";
    if a.len() < 4 {
        return Err(usage.into());
    }
    let kind = match a[0].as_str() {
        "http-claim" => Kind::HttpClaim,
        "http-healthz" => Kind::HttpHealthz,
        "resp-set" => Kind::RespSet,
        "http-apply" => Kind::HttpApply,
        "resp-apply" => Kind::RespApply,
        "http-claim-extend-release" => Kind::HttpCycle,
        other => return Err(format!("unknown kind '{other}'; {usage}")),
    };
    let num = |i: usize, what: &str, default: f64| -> Result<f64, String> {
        match a.get(i) {
            None => Ok(default),
            Some(s) => s
                .parse::<f64>()
                .ok()
                .filter(|v| *v > 0.0 || (what == "warm-up" && *v == 0.0))
                .ok_or_else(|| format!("{what} must be a positive number, not '{s}'")),
        }
    };
    Ok(Args {
        kind,
        addr: a[1]
            .parse()
            .map_err(|e| format!("address '{}': {e}", a[1]))?,
        conns: num(2, "connections", 0.0)? as usize,
        seconds: num(3, "seconds", 0.0)?,
        threads: num(4, "threads", 2.0)? as usize,
        warmup: num(5, "warm-up", 1.0)?,
    })
}

/// A small fast generator (xorshift64*), one per connection.
#[derive(Debug)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// What one connection measured.
#[derive(Debug, Default)]
struct Tally {
    /// Latencies after the warm-up, in microseconds.
    latencies: Vec<u32>,
    errors: u64,
}

/// The script of [`Kind::RespApply`]: KEYS[1] the event id, KEYS[2] the
/// stream, ARGV[1] the event's `created_at` (RFC 3339 sorts as text).
const APPLY_LUA: &str = "local h = redis.call('GET', KEYS[2]) \
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'EX', 604800) then return 0 end \
if (not h) or h < ARGV[1] then redis.call('SET', KEYS[2], ARGV[1], 'EX', 604800) end \
return 1";

/// An HTTP/1.1 request with a JSON body. Every request names a loopback
/// `Host`: without API tokens, dedupd serves no other.
fn http_json(out: &mut Vec<u8>, method: &str, path: &str, body: &str) -> std::io::Result<()> {
    use std::io::Write;
    write!(
        out,
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// A RESP command from its arguments.
fn resp(out: &mut Vec<u8>, args: &[&str]) {
    use std::io::Write;
    let _ = write!(out, "*{}\r\n", args.len());
    for a in args {
        let _ = write!(out, "${}\r\n{a}\r\n", a.len());
    }
}

fn request(
    kind: Kind,
    step: &Step,
    run: u64,
    conn: usize,
    n: u64,
    rng: &mut Rng,
    out: &mut Vec<u8>,
) {
    use std::io::Write;
    out.clear();
    // Writing into a Vec cannot fail.
    let _ = match (kind, step) {
        // Unique per run, connection and request: a key claimed by an
        // earlier run would answer 409.
        (Kind::HttpCycle, Step::Claim) => write!(
            out,
            "POST /v1/claims/lg{run:x}-{conn}-{n} HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\n\r\n"
        ),
        (Kind::HttpClaim, _) => write!(
            out,
            "POST /v1/claims/lg{run:x}-{conn}-{n}x{} HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\n\r\n",
            rng.next() % 2_147_483_647
        ),
        (Kind::HttpCycle, Step::Extend(key, token)) => http_json(
            out,
            "POST",
            &format!("/v1/claims/lg{run:x}-{conn}-{key}/extend"),
            &format!(r#"{{"token":"{token}"}}"#),
        ),
        (Kind::HttpCycle, Step::Release(key, token)) => http_json(
            out,
            "DELETE",
            &format!("/v1/claims/lg{run:x}-{conn}-{key}"),
            &format!(r#"{{"token":"{token}"}}"#),
        ),
        // Event ids unique too: a duplicate would write nothing.
        (Kind::HttpApply, _) => http_json(
            out,
            "POST",
            &format!(
                "/v1/streams/lg{run:x}-{conn}-{n}x{}/apply",
                rng.next() % 2_147_483_647
            ),
            &format!(r#"{{"event_id":"e{run:x}-{conn}-{n}","created_at":"2026-11-29T10:00:00Z"}}"#),
        ),
        (Kind::HttpHealthz, _) => write!(out, "GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"),
        (Kind::RespApply, Step::Script(sha)) => {
            let event = format!("e:{run:x}-{conn}-{n}");
            let stream = format!("s:{run:x}-{conn}-{n}x{}", rng.next() % 2_147_483_647);
            resp(
                out,
                &["EVALSHA", sha, "2", &event, &stream, "2026-11-29T10:00:00Z"],
            );
            Ok(())
        }
        (Kind::RespApply, _) => unreachable!("a resp-apply connection loads its script first"),
        (Kind::HttpCycle, Step::Script(_)) => unreachable!("only resp-apply loads a script"),
        (Kind::RespSet, _) => {
            let key = format!("k:{:012}", rng.next() % 100_000_000);
            resp(out, &["SET", &key, "processing", "NX", "EX", "300"]);
            Ok(())
        }
    };
}

/// The length of the first whole answer in `buf` and whether it was a
/// success, or `None` while it is incomplete.
fn answer(kind: Kind, buf: &[u8]) -> Result<Option<(usize, bool)>, String> {
    match kind {
        Kind::HttpClaim | Kind::HttpHealthz | Kind::HttpApply | Kind::HttpCycle => {
            let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                return Ok(None);
            };
            let head = std::str::from_utf8(&buf[..end]).map_err(|_| "non-UTF-8 HTTP head")?;
            let status: u16 = head
                .split(' ')
                .nth(1)
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| format!("bad status line: {head:.60}"))?;
            let len = head
                .lines()
                .find_map(|l| {
                    let (name, value) = l.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse::<usize>().ok())
                        .flatten()
                })
                // A 204 has no body, and no Content-Length.
                .or((status == 204).then_some(0))
                .ok_or("an answer without Content-Length")?;
            let total = end + 4 + len;
            Ok((buf.len() >= total).then_some((total, (200..300).contains(&status))))
        }
        Kind::RespSet | Kind::RespApply => {
            let Some(eol) = buf.windows(2).position(|w| w == b"\r\n") else {
                return Ok(None);
            };
            match buf.first() {
                Some(b'+' | b':') => Ok(Some((eol + 2, true))),
                Some(b'-') => Ok(Some((eol + 2, false))),
                Some(b'$') => {
                    let len: i64 = std::str::from_utf8(&buf[1..eol])
                        .ok()
                        .and_then(|s| s.parse().ok())
                        .ok_or("bad bulk length")?;
                    if len < 0 {
                        return Ok(Some((eol + 2, true)));
                    }
                    let total = eol + 2 + len as usize + 2;
                    Ok((buf.len() >= total).then_some((total, true)))
                }
                _ => Err(format!("unexpected RESP answer: {:?}", &buf[..eol.min(40)])),
            }
        }
    }
}

/// What a [`Kind::HttpCycle`] connection sends after an answer: extend
/// a new claim with the token its answer shows, then release it, then
/// claim the next key. A refused claim is claimed anew (the refusal counts
/// as an error).
fn next_step(step: Step, n: u64, ok: bool, answer: &[u8]) -> Step {
    match step {
        Step::Claim if ok => {
            let text = String::from_utf8_lossy(answer);
            match text.split_once(r#""token":""#) {
                Some((_, rest)) => {
                    Step::Extend(n, rest.chars().take_while(|c| *c != '"').collect())
                }
                None => Step::Claim,
            }
        }
        Step::Claim => Step::Claim,
        Step::Extend(key, token) => Step::Release(key, token),
        Step::Release(..) => Step::Claim,
        script @ Step::Script(_) => script,
    }
}

/// Reads what `stream` has into `buf`, waiting up to [`ANSWER_WITHIN`].
async fn read_more(
    stream: &mut TcpStream,
    chunk: &mut [u8],
    buf: &mut Vec<u8>,
) -> Result<(), String> {
    let got = tokio::time::timeout(ANSWER_WITHIN, stream.read(chunk))
        .await
        .map_err(|_| format!("no answer within {ANSWER_WITHIN:?}"))?
        .map_err(|e| format!("read: {e}"))?;
    if got == 0 {
        return Err("the server closed the connection".into());
    }
    buf.extend_from_slice(&chunk[..got]);
    Ok(())
}

async fn connection(
    kind: Kind,
    addr: SocketAddr,
    run: u64,
    conn: usize,
    measure_from: Instant,
    until: Instant,
) -> Result<Tally, String> {
    let mut stream = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect {addr}: {e}"))?;
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    // Seeded by the run too: a SET NX of a key an earlier run stored is
    // refused without a write, which would make that server's run cheaper.
    let mut rng = Rng((run ^ (conn as u64 + 1).wrapping_mul(0xD1B5_4A32_D192_ED03)) | 1);
    let mut tally = Tally {
        latencies: Vec::with_capacity(1 << 16),
        errors: 0,
    };
    let mut out = Vec::with_capacity(256);
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    let mut n = 0u64;
    let mut step = Step::Claim;
    if kind == Kind::RespApply {
        out.clear();
        resp(&mut out, &["SCRIPT", "LOAD", APPLY_LUA]);
        stream
            .write_all(&out)
            .await
            .map_err(|e| format!("write: {e}"))?;
        let sha = loop {
            if let Some((len, ok)) = answer(kind, &buf)? {
                let reply = String::from_utf8_lossy(&buf[..len]).into_owned();
                buf.drain(..len);
                // `$40\r\n<sha1>\r\n`
                match reply.split("\r\n").nth(1) {
                    Some(sha) if ok && sha.len() == 40 => break sha.to_owned(),
                    _ => return Err(format!("SCRIPT LOAD answered {reply:?}")),
                }
            }
            read_more(&mut stream, &mut chunk, &mut buf).await?;
        };
        step = Step::Script(sha);
    }
    loop {
        let sent = Instant::now();
        if sent >= until {
            return Ok(tally);
        }
        n += 1;
        request(kind, &step, run, conn, n, &mut rng, &mut out);
        stream
            .write_all(&out)
            .await
            .map_err(|e| format!("write: {e}"))?;
        let ok = loop {
            if let Some((len, ok)) = answer(kind, &buf)? {
                if kind == Kind::HttpCycle {
                    step = next_step(std::mem::take(&mut step), n, ok, &buf[..len]);
                }
                buf.drain(..len);
                break ok;
            }
            read_more(&mut stream, &mut chunk, &mut buf).await?;
        };
        if sent >= measure_from {
            let us = sent.elapsed().as_micros();
            tally.latencies.push(u32::try_from(us).unwrap_or(u32::MAX));
            tally.errors += u64::from(!ok);
        }
    }
}

/// `sorted` with `wrk`'s correction for coordinated omission (see the
/// module's documentation), sorted.
fn corrected(sorted: &[u32], conns: usize, seconds: f64) -> Vec<u32> {
    let mut out = sorted.to_vec();
    let per_conn = sorted.len() as f64 / conns.max(1) as f64;
    // Whole microseconds, as `wrk` counts.
    let interval = if per_conn >= 1.0 {
        (seconds * 1e6 / per_conn) as u64
    } else {
        0
    };
    if interval == 0 {
        return out;
    }
    for &l in sorted.iter().rev() {
        let l = u64::from(l);
        if l < 2 * interval {
            break;
        }
        let mut m = l - interval;
        while m > interval {
            out.push(u32::try_from(m).unwrap_or(u32::MAX));
            m -= interval;
        }
    }
    out.sort_unstable();
    out
}

/// Runs `conns` connections, each one request at a time, for `warmup`
/// and then `seconds`: the latencies after the warm-up in microseconds,
/// sorted, and how many of those answers were not successes. Also what
/// `benches/fleet.rs` measures claims with.
pub(crate) async fn closed_loop(
    kind: Kind,
    addr: SocketAddr,
    conns: usize,
    seconds: f64,
    warmup: f64,
) -> Result<(Vec<u32>, u64), String> {
    // Tells this run's keys from an earlier run's.
    let run = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64);
    let start = Instant::now();
    let measure_from = start + Duration::from_secs_f64(warmup);
    let until = measure_from + Duration::from_secs_f64(seconds);
    let tasks: Vec<_> = (0..conns)
        .map(|c| tokio::spawn(connection(kind, addr, run, c, measure_from, until)))
        .collect();
    let mut all = Vec::new();
    let mut errors = 0;
    for t in tasks {
        let tally = t.await.map_err(|e| e.to_string())??;
        all.extend(tally.latencies);
        errors += tally.errors;
    }
    all.sort_unstable();
    Ok((all, errors))
}

pub(crate) fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    f64::from(sorted[i.min(sorted.len() - 1)]) / 1000.0
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("loadgen: {e}");
            std::process::exit(2);
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads.max(1))
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let (kind, conns, seconds) = (args.kind, args.conns, args.seconds);
    let result = rt.block_on(closed_loop(kind, args.addr, conns, seconds, args.warmup));
    let (all, errors) = match result {
        Ok(r) => r,
        Err(e) => {
            eprintln!("loadgen: {e}");
            std::process::exit(1);
        }
    };
    let name = kind.name();
    let co = corrected(&all, conns, seconds);
    println!(
        "RESULT kind={name} conns={} requests={} rps={:.0} p50_ms={:.3} p90_ms={:.3} p99_ms={:.3} p999_ms={:.3} max_ms={:.3} p99co_ms={:.3} errors={errors}",
        conns,
        all.len(),
        all.len() as f64 / seconds,
        percentile(&all, 50.0),
        percentile(&all, 90.0),
        percentile(&all, 99.0),
        percentile(&all, 99.9),
        all.last().map_or(0.0, |v| f64::from(*v) / 1000.0),
        percentile(&co, 99.0),
    );
}
