//! A request frame to a command, and the command to its handler: the
//! command table (names and arities as Redis declares them), the checks
//! Redis makes before any command runs, in its order (unknown command,
//! arity, authentication), and the helpers handlers share.

use std::future::Future;
use std::pin::Pin;

use bytes::Bytes;

use super::reply::Reply;
use super::{Context, Session, expiry, introspection, keys, session};

/// Largest key stored, in bytes.
pub const MAX_KEY_BYTES: usize = 4096;
/// Largest value stored, in bytes.
pub const MAX_VALUE_BYTES: usize = 1024 * 1024;

/// A reply that comes once a queued write is committed.
pub type Pending = Pin<Box<dyn Future<Output = Reply> + Send>>;

/// What running a command gave.
pub enum Step {
    /// The reply, now.
    Reply(Reply),
    /// A write queued at the writer; its reply comes after the commit.
    Write(Pending),
}

impl std::fmt::Debug for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Step::Reply(r) => f.debug_tuple("Reply").field(r).finish(),
            Step::Write(_) => f.write_str("Write(..)"),
        }
    }
}

/// One command the listener knows.
#[derive(Debug)]
struct Spec {
    /// Upper-case name.
    name: &'static str,
    /// Redis's arity: `n` exactly n words (with the name), `-n` at least n.
    arity: i32,
    /// Queued at the writer without waiting for the commands before it
    /// (they are keyspace writes or replies already known).
    queued: bool,
    /// Allowed before authentication.
    no_auth: bool,
}

const fn spec(name: &'static str, arity: i32, queued: bool, no_auth: bool) -> Spec {
    Spec {
        name,
        arity,
        queued,
        no_auth,
    }
}

/// Every command served, as Redis 7 declares its arity.
const COMMANDS: &[Spec] = &[
    spec("GET", 2, false, false),
    spec("SET", -3, true, false),
    spec("DEL", -2, true, false),
    spec("UNLINK", -2, true, false),
    spec("EXISTS", -2, false, false),
    spec("EXPIRE", -3, true, false),
    spec("PEXPIRE", -3, true, false),
    spec("PERSIST", 2, true, false),
    spec("TTL", 2, false, false),
    spec("PTTL", 2, false, false),
    spec("PING", -1, false, false),
    spec("ECHO", 2, false, false),
    spec("HELLO", -1, false, true),
    spec("AUTH", -2, false, true),
    spec("SELECT", 2, false, false),
    spec("CLIENT", -2, false, false),
    spec("QUIT", -1, false, true),
    spec("RESET", 1, false, true),
    spec("COMMAND", -1, false, false),
    spec("INFO", -1, false, false),
];

/// The served commands as (lower-case name, arity), for `COMMAND`.
pub fn table() -> impl Iterator<Item = (String, i32)> {
    COMMANDS
        .iter()
        .map(|s| (s.name.to_ascii_lowercase(), s.arity))
}

fn find(name: &[u8]) -> Option<&'static Spec> {
    COMMANDS
        .iter()
        .find(|s| s.name.as_bytes().eq_ignore_ascii_case(name))
}

/// Whether the command `args` may be queued behind writes whose replies
/// have not come yet; any other command waits for them first, so it sees
/// their effects. A `SET … GET` is not: its reply is the old value, up to
/// 1 MiB, and a pipeline of them queued at once would hold every reply in
/// memory before one is written (a gibibyte for 1,024 of them); run one at
/// a time, its reply goes out before the next is read.
pub fn is_queued(args: &[Bytes]) -> bool {
    let Some(spec) = args.first().and_then(|name| find(name)) else {
        return false;
    };
    let options = args.get(3..).unwrap_or_default();
    spec.queued && !(spec.name == "SET" && options.iter().any(|a| is(a, "get")))
}

/// Runs one command (`args[0]` is its name).
pub async fn run(ctx: &Context, session: &mut Session, args: Vec<Bytes>) -> Step {
    let Some(spec) = find(&args[0]) else {
        return Step::Reply(unknown_command(&args));
    };
    let argc = i32::try_from(args.len()).unwrap_or(i32::MAX);
    if (spec.arity > 0 && argc != spec.arity) || argc < spec.arity.abs() {
        return Step::Reply(wrong_arity(&spec.name.to_ascii_lowercase()));
    }
    if !session.authenticated && !spec.no_auth {
        return Step::Reply(Reply::Error("NOAUTH Authentication required.".into()));
    }
    let reply = match spec.name {
        "SET" => return keys::set(ctx, &args).await,
        "DEL" | "UNLINK" => return keys::del(ctx, &args).await,
        "EXPIRE" => return expiry::expire(ctx, &args, 1000, "expire").await,
        "PEXPIRE" => return expiry::expire(ctx, &args, 1, "pexpire").await,
        "PERSIST" => return expiry::persist(ctx, &args).await,
        "GET" => keys::get(ctx, &args).await,
        "EXISTS" => keys::exists(ctx, &args).await,
        "TTL" => expiry::ttl(ctx, &args, false).await,
        "PTTL" => expiry::ttl(ctx, &args, true).await,
        "PING" => session::ping(&args),
        "ECHO" => Reply::Bulk(args[1].clone()),
        "HELLO" => session::hello(ctx, session, &args),
        "AUTH" => session::auth(ctx, session, &args),
        "SELECT" => session::select(&args),
        "CLIENT" => session::client(session, &args),
        "QUIT" => {
            session.closing = true;
            Reply::OK
        }
        "RESET" => session::reset(ctx, session),
        "COMMAND" => introspection::command(&args),
        "INFO" => introspection::info(ctx),
        other => unreachable_command(other),
    };
    Step::Reply(reply)
}

/// A name in the table without a handler: a bug, answered as unknown.
fn unreachable_command(name: &str) -> Reply {
    tracing::error!(command = name, "RESP command in the table has no handler");
    Reply::err(format!("unknown command '{name}'"))
}

/// `ERR unknown command 'NAME', with args beginning with: 'a' 'b' `, as
/// Redis words it (name and arguments cut at 128 bytes).
pub fn unknown_command(args: &[Bytes]) -> Reply {
    let mut listed = String::new();
    for arg in &args[1..] {
        if listed.len() >= 128 {
            break;
        }
        let room = 128 - listed.len();
        listed.push('\'');
        listed.push_str(&lossy(&arg[..arg.len().min(room)]));
        listed.push_str("' ");
    }
    let name = &args[0][..args[0].len().min(128)];
    Reply::err(format!(
        "unknown command '{}', with args beginning with: {listed}",
        lossy(name)
    ))
}

/// `ERR wrong number of arguments for 'NAME' command`.
pub fn wrong_arity(name: &str) -> Reply {
    Reply::err(format!("wrong number of arguments for '{name}' command"))
}

/// `ERR syntax error`.
pub fn syntax_error() -> Reply {
    Reply::err("syntax error")
}

/// `ERR value is not an integer or out of range`.
pub fn not_an_integer() -> Reply {
    Reply::err("value is not an integer or out of range")
}

/// Text of a word for an error message.
pub fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Parses an integer as strictly as Redis does: an optional `-`, then
/// `0` alone or digits without a leading zero, within i64.
pub fn parse_i64(b: &[u8]) -> Option<i64> {
    let digits = b.strip_prefix(b"-").unwrap_or(b);
    let well_formed = match digits {
        [b'0'] => b.len() == 1,
        [b'1'..=b'9', rest @ ..] => rest.iter().all(u8::is_ascii_digit),
        _ => false,
    };
    if !well_formed {
        return None;
    }
    std::str::from_utf8(b).ok()?.parse().ok()
}

/// Whether `word` is `option`, ignoring ASCII case.
pub fn is(word: &[u8], option: &str) -> bool {
    word.eq_ignore_ascii_case(option.as_bytes())
}

/// An error reply for a store failure; nothing was changed. It names the
/// cause (`ERR store unavailable: the data file cannot be written now …`).
pub fn store_error(e: &crate::store::StoreError) -> Reply {
    match e {
        // Redis's code for "persistence cannot take writes now" (its AOF
        // on a full disk): clients treat it as an error to retry later.
        crate::store::StoreError::LowSpace { .. } => Reply::Error(format!("MISCONF {e}")),
        // Redis's code for a write refused at `maxmemory`.
        crate::store::StoreError::KeysFull { .. } => Reply::Error(format!("OOM {e}")),
        _ => Reply::err(e.chain()),
    }
}
