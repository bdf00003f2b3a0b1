//! COMMAND and INFO: enough for redis-cli, redis-benchmark and client
//! libraries to connect and look around without errors.

use bytes::Bytes;

use super::Context;
use super::command::{is, lossy, table};
use super::reply::Reply;
use super::session::REDIS_VERSION;

/// One command's `COMMAND INFO` entry: name, arity, flags, first key,
/// last key, key step.
fn entry(name: &str, arity: i32) -> Reply {
    let keyed = !matches!(
        name,
        "ping"
            | "echo"
            | "hello"
            | "auth"
            | "select"
            | "client"
            | "quit"
            | "reset"
            | "command"
            | "info"
    );
    let last = if keyed && arity < -2 {
        1
    } else if keyed && arity == -2 {
        -1
    } else {
        i64::from(keyed)
    };
    Reply::Array(vec![
        Reply::text(name),
        Reply::Int(i64::from(arity)),
        Reply::Array(Vec::new()),
        Reply::Int(i64::from(keyed)),
        Reply::Int(last),
        Reply::Int(i64::from(keyed)),
    ])
}

/// `COMMAND`, `COMMAND COUNT`, `COMMAND INFO name…`, `COMMAND DOCS`
/// (empty: no docs to show), `COMMAND LIST`.
pub fn command(args: &[Bytes]) -> Reply {
    let Some(sub) = args.get(1) else {
        return Reply::Array(table().map(|(n, a)| entry(&n, a)).collect());
    };
    if is(sub, "count") && args.len() == 2 {
        Reply::Int(i64::try_from(table().count()).unwrap_or(0))
    } else if is(sub, "list") && args.len() == 2 {
        Reply::Array(table().map(|(n, _)| Reply::text(n)).collect())
    } else if is(sub, "info") {
        Reply::Array(
            args[2..]
                .iter()
                .map(|want| {
                    table()
                        .find(|(n, _)| n.as_bytes().eq_ignore_ascii_case(want))
                        .map_or(Reply::Null, |(n, a)| entry(&n, a))
                })
                .collect(),
        )
    } else if is(sub, "docs") {
        Reply::Map(Vec::new())
    } else {
        Reply::err(format!(
            "unknown subcommand or wrong number of arguments for '{}'. Try COMMAND HELP.",
            lossy(sub)
        ))
    }
}

/// `INFO [section …]`: the server, clients and persistence sections,
/// whatever sections are asked for.
pub fn info(ctx: &Context) -> Reply {
    let text = format!(
        "# Server\r\nredis_version:{REDIS_VERSION}\r\nredis_mode:standalone\r\n\
         dedupd_version:{}\r\nprocess_id:{}\r\ntcp_port:{}\r\n\r\n\
         # Clients\r\nconnected_clients:{}\r\nmaxclients:{}\r\n\r\n\
         # Persistence\r\naof_enabled:1\r\n\
         dedupd_durability:every write is synced to disk before its reply\r\n",
        env!("CARGO_PKG_VERSION"),
        std::process::id(),
        ctx.port,
        ctx.connections(),
        ctx.max_connections,
    );
    Reply::Bulk(Bytes::from(text))
}
