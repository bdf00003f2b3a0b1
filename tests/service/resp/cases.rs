//! The cells every command is checked in, written once: a command, and the
//! reply Redis gives. The same table runs against a real redis-server and
//! against dedupd (`conformance.rs`), so our answers cannot drift from
//! Redis's.
//!
//! Words are split on spaces; placeholders: `{k}`, `{k2}`, `{k3}` are keys
//! of the case's own; `{past_s}` / `{past_ms}` a Unix time 100 s ago,
//! `{future_s}` / `{future_ms}` 1000 s ahead; `{bin}` a key with NUL, CR, LF
//! and a space in it, `{binval}` a value with every byte value; `{empty}`
//! the empty string; `{long}` 200 bytes and `{x128}` its first 128 (error
//! texts are cut there). Expected bulk strings and errors expand them too.

use Expect::AnyInt;
use Expect::Bulk;
use Expect::BulkContaining;
use Expect::Err;
use Expect::Hello;
use Expect::Int;
use Expect::IntIn;
use Expect::MapOrArray;
use Expect::Nil;
use Expect::Ok;
use Expect::Status;
/// What a reply must be.
#[derive(Debug, Clone)]
pub enum Expect {
    /// `+OK`.
    Ok,
    /// A status other than OK (`+PONG`, `+RESET`).
    Status(&'static str),
    /// Nil: `$-1` in RESP2, `_` in RESP3.
    Nil,
    /// An integer.
    Int(i64),
    /// An integer in this range (TTLs, while the reference server's clock
    /// moves).
    IntIn(i64, i64),
    /// Any integer (connection ids, counts of things that differ).
    AnyInt,
    /// A bulk string (a placeholder word expands as in commands).
    Bulk(&'static str),
    /// An error with exactly this text.
    Err(&'static str),
    /// A bulk string containing this.
    BulkContaining(&'static str),
    /// HELLO's description (server, version, proto N, id, mode, role,
    /// modules): a map in RESP3, a flat array in RESP2.
    Hello(i64),
    /// A map (RESP3) or an array (RESP2) of anything.
    MapOrArray,
    /// `+OK`, then the server closes the connection.
    OkThenClosed,
}

/// One step of a case.
#[derive(Debug, Clone)]
pub struct Step {
    /// The command line, with placeholders.
    pub line: &'static str,
    /// Its reply.
    pub expect: Expect,
}

/// A sequence of commands on one connection, from a clean keyspace.
#[derive(Debug, Clone)]
pub struct Case {
    /// What it checks.
    pub name: &'static str,
    /// The steps, in order.
    pub steps: Vec<Step>,
    /// The Redis version that first answers like this: older reference
    /// servers skip the case (CLIENT SETINFO came with 7.2).
    pub since: (u32, u32),
    /// Redis runs these commands; dedupd refuses them (the subset).
    pub dedupd_only: bool,
}

fn case(name: &'static str, steps: &[(&'static str, Expect)]) -> Case {
    Case {
        name,
        steps: steps
            .iter()
            .map(|(line, expect)| Step {
                line,
                expect: expect.clone(),
            })
            .collect(),
        since: (0, 0),
        dedupd_only: false,
    }
}

const SYNTAX: Expect = Err("ERR syntax error");
const NOT_INT: Expect = Err("ERR value is not an integer or out of range");
const SET_EXPIRE: Expect = Err("ERR invalid expire time in 'set' command");

/// The cases without authentication.
pub fn cases() -> Vec<Case> {
    let mut all = vec![
        // SET, absent / present / expired, each option.
        case(
            "set on an absent key stores it without expiry",
            &[
                ("SET {k} v", Ok),
                ("GET {k}", Bulk("v")),
                ("TTL {k}", Int(-1)),
                ("PTTL {k}", Int(-1)),
            ],
        ),
        case(
            "set on a present key overwrites it and drops its expiry",
            &[
                ("SET {k} a EX 100", Ok),
                ("SET {k} b", Ok),
                ("GET {k}", Bulk("b")),
                ("TTL {k}", Int(-1)),
            ],
        ),
        case(
            "set nx on an absent key stores it",
            &[("SET {k} v NX", Ok), ("GET {k}", Bulk("v"))],
        ),
        case(
            "set nx on a present key is refused with nil and changes nothing",
            &[
                ("SET {k} a", Ok),
                ("SET {k} b NX", Nil),
                ("GET {k}", Bulk("a")),
                ("TTL {k}", Int(-1)),
            ],
        ),
        case(
            "set nx on an expired key stores it",
            &[
                ("SET {k} a PXAT {past_ms}", Ok),
                ("SET {k} b NX", Ok),
                ("GET {k}", Bulk("b")),
            ],
        ),
        case(
            "set xx on an absent key is refused with nil",
            &[("SET {k} v XX", Nil), ("EXISTS {k}", Int(0))],
        ),
        case(
            "set xx on a present key overwrites it",
            &[
                ("SET {k} a", Ok),
                ("SET {k} b XX", Ok),
                ("GET {k}", Bulk("b")),
            ],
        ),
        case(
            "set xx on an expired key is refused",
            &[
                ("SET {k} a PXAT {past_ms}", Ok),
                ("SET {k} b XX", Nil),
                ("GET {k}", Nil),
            ],
        ),
        case(
            "the article's claim: set nx ex on an absent key, then again",
            &[
                ("SET {k} processing NX EX 300", Ok),
                ("SET {k} processing NX EX 300", Nil),
                ("GET {k}", Bulk("processing")),
                ("TTL {k}", IntIn(299, 300)),
                ("SET {k} done EX 86400", Ok),
                ("TTL {k}", IntIn(86_399, 86_400)),
                ("GET {k}", Bulk("done")),
                ("DEL {k}", Int(1)),
                ("SET {k} processing NX EX 300", Ok),
            ],
        ),
        case(
            "set ex sets a ttl in seconds",
            &[
                ("SET {k} v EX 300", Ok),
                ("TTL {k}", IntIn(299, 300)),
                ("PTTL {k}", IntIn(298_000, 300_000)),
            ],
        ),
        case(
            "set px sets a ttl in milliseconds",
            &[
                ("SET {k} v PX 300000", Ok),
                ("TTL {k}", IntIn(299, 300)),
                ("PTTL {k}", IntIn(298_000, 300_000)),
            ],
        ),
        case(
            "set exat in the future expires then",
            &[
                ("SET {k} v EXAT {future_s}", Ok),
                ("TTL {k}", IntIn(998, 1000)),
            ],
        ),
        case(
            "set pxat in the future expires then",
            &[
                ("SET {k} v PXAT {future_ms}", Ok),
                ("PTTL {k}", IntIn(998_000, 1_000_000)),
            ],
        ),
        case(
            "set exat in the past answers ok and the key is gone",
            &[
                ("SET {k} old", Ok),
                ("SET {k} v EXAT {past_s}", Ok),
                ("GET {k}", Nil),
                ("EXISTS {k}", Int(0)),
                ("TTL {k}", Int(-2)),
                ("PTTL {k}", Int(-2)),
            ],
        ),
        case(
            "set keepttl keeps the old expiry",
            &[
                ("SET {k} a EX 300", Ok),
                ("SET {k} b KEEPTTL", Ok),
                ("GET {k}", Bulk("b")),
                ("TTL {k}", IntIn(299, 300)),
            ],
        ),
        case(
            "set keepttl on an absent key stores it without expiry",
            &[("SET {k} b KEEPTTL", Ok), ("TTL {k}", Int(-1))],
        ),
        case(
            "set keepttl on an expired key stores it without expiry",
            &[
                ("SET {k} a PXAT {past_ms}", Ok),
                ("SET {k} b KEEPTTL", Ok),
                ("TTL {k}", Int(-1)),
            ],
        ),
        case(
            "set get answers the old value",
            &[
                ("SET {k} a", Ok),
                ("SET {k} b GET", Bulk("a")),
                ("GET {k}", Bulk("b")),
            ],
        ),
        case(
            "set get on an absent key answers nil and stores",
            &[("SET {k} b GET", Nil), ("GET {k}", Bulk("b"))],
        ),
        case(
            "set get on an expired key answers nil",
            &[
                ("SET {k} a PXAT {past_ms}", Ok),
                ("SET {k} b GET", Nil),
                ("GET {k}", Bulk("b")),
            ],
        ),
        case(
            "set nx get on a present key answers the old value and keeps it",
            &[
                ("SET {k} a", Ok),
                ("SET {k} b NX GET", Bulk("a")),
                ("GET {k}", Bulk("a")),
            ],
        ),
        case(
            "set nx get on an absent key answers nil and stores",
            &[("SET {k} b NX GET", Nil), ("GET {k}", Bulk("b"))],
        ),
        case(
            "set xx get on an absent key answers nil and stores nothing",
            &[("SET {k} b XX GET", Nil), ("EXISTS {k}", Int(0))],
        ),
        case(
            "set xx get ex on a present key answers the old value",
            &[
                ("SET {k} a", Ok),
                ("SET {k} b XX GET EX 100", Bulk("a")),
                ("TTL {k}", IntIn(99, 100)),
            ],
        ),
        case(
            "set options are case-insensitive and may repeat",
            &[
                ("set {k} v nx ex 300", Ok),
                ("SET {k} w xx XX Ex 10 eX 20", Ok),
                ("TTL {k}", IntIn(19, 20)),
                ("SET {k} x GET get", Bulk("w")),
            ],
        ),
        case(
            "set refuses bad options with redis's errors and changes nothing",
            &[
                (
                    "SET {k}",
                    Err("ERR wrong number of arguments for 'set' command"),
                ),
                (
                    "SET",
                    Err("ERR wrong number of arguments for 'set' command"),
                ),
                ("SET {k} v NX XX", SYNTAX),
                ("SET {k} v XX NX", SYNTAX),
                ("SET {k} v EX", SYNTAX),
                ("SET {k} v EX 10 PX 100", SYNTAX),
                ("SET {k} v EX 10 KEEPTTL", SYNTAX),
                ("SET {k} v KEEPTTL PXAT 10", SYNTAX),
                ("SET {k} v EXAT 10 EX 10", SYNTAX),
                ("SET {k} v FOO", SYNTAX),
                ("SET {k} v NX 10", SYNTAX),
                ("SET {k} v EX 0", SET_EXPIRE),
                ("SET {k} v EX -5", SET_EXPIRE),
                ("SET {k} v PX 0", SET_EXPIRE),
                ("SET {k} v EXAT 0", SET_EXPIRE),
                ("SET {k} v PXAT -1", SET_EXPIRE),
                ("SET {k} v EX 9223372036854775807", SET_EXPIRE),
                ("SET {k} v PX 9223372036854775807", SET_EXPIRE),
                ("SET {k} v EXAT 9223372036854776", SET_EXPIRE),
                ("SET {k} v EX abc", NOT_INT),
                ("SET {k} v EX 1.5", NOT_INT),
                ("SET {k} v EX 010", NOT_INT),
                ("SET {k} v PX {empty}", NOT_INT),
                ("SET {k} v EX 99999999999999999999", NOT_INT),
                ("SET {k} v NX EX abc", NOT_INT),
                ("EXISTS {k}", Int(0)),
            ],
        ),
        case(
            "keys and values are binary-safe",
            &[
                ("SET {bin} {binval}", Ok),
                ("GET {bin}", Bulk("{binval}")),
                ("EXISTS {bin}", Int(1)),
                ("SET {k} {empty}", Ok),
                ("GET {k}", Bulk("{empty}")),
                ("EXISTS {k}", Int(1)),
                ("SET {empty} v", Ok),
                ("GET {empty}", Bulk("v")),
                ("DEL {bin} {empty}", Int(2)),
            ],
        ),
        // GET
        case("get on an absent key is nil", &[("GET {k}", Nil)]),
        case(
            "get on an expired key is nil",
            &[("SET {k} v PXAT {past_ms}", Ok), ("GET {k}", Nil)],
        ),
        case(
            "get with the wrong number of arguments",
            &[
                (
                    "GET",
                    Err("ERR wrong number of arguments for 'get' command"),
                ),
                (
                    "GET {k} {k2}",
                    Err("ERR wrong number of arguments for 'get' command"),
                ),
            ],
        ),
        // DEL / UNLINK
        case(
            "del counts the keys that existed, each once",
            &[
                ("DEL {k}", Int(0)),
                ("SET {k} a", Ok),
                ("SET {k2} b", Ok),
                ("DEL {k} {k2} {k3} {k}", Int(2)),
                ("EXISTS {k} {k2}", Int(0)),
                ("DEL {k}", Int(0)),
            ],
        ),
        case(
            "del of an expired key counts nothing",
            &[("SET {k} a PXAT {past_ms}", Ok), ("DEL {k}", Int(0))],
        ),
        case(
            "unlink is del",
            &[
                ("SET {k} a", Ok),
                ("UNLINK {k} {k2}", Int(1)),
                ("GET {k}", Nil),
                ("UNLINK {k}", Int(0)),
            ],
        ),
        case(
            "del and unlink need a key",
            &[
                (
                    "DEL",
                    Err("ERR wrong number of arguments for 'del' command"),
                ),
                (
                    "UNLINK",
                    Err("ERR wrong number of arguments for 'unlink' command"),
                ),
            ],
        ),
        // EXISTS
        case(
            "exists counts a repeated key each time",
            &[
                ("EXISTS {k}", Int(0)),
                ("SET {k} a", Ok),
                ("EXISTS {k} {k} {k2}", Int(2)),
                ("SET {k2} a PXAT {past_ms}", Ok),
                ("EXISTS {k2}", Int(0)),
                (
                    "EXISTS",
                    Err("ERR wrong number of arguments for 'exists' command"),
                ),
            ],
        ),
        // EXPIRE / PEXPIRE
        case(
            "expire on an absent or expired key is 0",
            &[
                ("EXPIRE {k} 100", Int(0)),
                ("SET {k} a PXAT {past_ms}", Ok),
                ("EXPIRE {k} 100", Int(0)),
                ("EXISTS {k}", Int(0)),
            ],
        ),
        case(
            "expire sets a ttl",
            &[
                ("SET {k} a", Ok),
                ("EXPIRE {k} 100", Int(1)),
                ("TTL {k}", IntIn(99, 100)),
                ("GET {k}", Bulk("a")),
                ("EXPIRE {k} 200", Int(1)),
                ("TTL {k}", IntIn(199, 200)),
            ],
        ),
        case(
            "expire nx applies only without a ttl",
            &[
                ("SET {k} a", Ok),
                ("EXPIRE {k} 100 NX", Int(1)),
                ("EXPIRE {k} 200 NX", Int(0)),
                ("TTL {k}", IntIn(99, 100)),
            ],
        ),
        case(
            "expire xx applies only with a ttl",
            &[
                ("SET {k} a", Ok),
                ("EXPIRE {k} 100 XX", Int(0)),
                ("TTL {k}", Int(-1)),
                ("EXPIRE {k} 100", Int(1)),
                ("EXPIRE {k} 200 xx", Int(1)),
                ("TTL {k}", IntIn(199, 200)),
            ],
        ),
        case(
            "expire gt applies only to a later expiry, never without a ttl",
            &[
                ("SET {k} a", Ok),
                ("EXPIRE {k} 100 GT", Int(0)),
                ("TTL {k}", Int(-1)),
                ("EXPIRE {k} 100", Int(1)),
                ("EXPIRE {k} 50 GT", Int(0)),
                ("EXPIRE {k} 200 GT", Int(1)),
                ("TTL {k}", IntIn(199, 200)),
                ("EXPIRE {k} 300 XX GT", Int(1)),
                ("TTL {k}", IntIn(299, 300)),
            ],
        ),
        case(
            "expire lt applies to an earlier expiry, and without a ttl",
            &[
                ("SET {k} a", Ok),
                ("EXPIRE {k} 300 LT", Int(1)),
                ("TTL {k}", IntIn(299, 300)),
                ("EXPIRE {k} 400 LT", Int(0)),
                ("EXPIRE {k} 200 LT", Int(1)),
                ("TTL {k}", IntIn(199, 200)),
                ("SET {k2} a", Ok),
                ("EXPIRE {k2} 100 XX LT", Int(0)),
                ("TTL {k2}", Int(-1)),
                ("EXPIRE {k} 100 XX LT", Int(1)),
                ("TTL {k}", IntIn(99, 100)),
            ],
        ),
        case(
            "expire with a time not in the future deletes the key",
            &[
                ("SET {k} a", Ok),
                ("EXPIRE {k} 0", Int(1)),
                ("EXISTS {k}", Int(0)),
                ("SET {k} a", Ok),
                ("EXPIRE {k} -10", Int(1)),
                ("GET {k}", Nil),
                ("SET {k} a", Ok),
                ("PEXPIRE {k} -9223372036854775807", Int(1)),
                ("GET {k}", Nil),
            ],
        ),
        case(
            "expire refuses bad input with redis's errors",
            &[
                ("SET {k} a", Ok),
                (
                    "EXPIRE {k}",
                    Err("ERR wrong number of arguments for 'expire' command"),
                ),
                ("EXPIRE {k} abc", NOT_INT),
                ("EXPIRE {k} 1.5", NOT_INT),
                ("EXPIRE {k} 10 FOO", Err("ERR Unsupported option FOO")),
                ("EXPIRE {k} abc foo", Err("ERR Unsupported option foo")),
                (
                    "EXPIRE {k} 10 NX XX",
                    Err("ERR NX and XX, GT or LT options at the same time are not compatible"),
                ),
                (
                    "EXPIRE {k} 10 NX GT",
                    Err("ERR NX and XX, GT or LT options at the same time are not compatible"),
                ),
                (
                    "EXPIRE {k} 10 GT LT",
                    Err("ERR GT and LT options at the same time are not compatible"),
                ),
                (
                    "EXPIRE {k} 9223372036854775807",
                    Err("ERR invalid expire time in 'expire' command"),
                ),
                (
                    "EXPIRE {k} -9223372036854775807",
                    Err("ERR invalid expire time in 'expire' command"),
                ),
                (
                    "PEXPIRE {k} 9223372036854775807",
                    Err("ERR invalid expire time in 'pexpire' command"),
                ),
                (
                    "PEXPIRE {k}",
                    Err("ERR wrong number of arguments for 'pexpire' command"),
                ),
                ("TTL {k}", Int(-1)),
            ],
        ),
        case(
            "pexpire sets a ttl in milliseconds, with the same options",
            &[
                ("SET {k} a", Ok),
                ("PEXPIRE {k} 100000", Int(1)),
                ("PTTL {k}", IntIn(98_000, 100_000)),
                ("PEXPIRE {k} 50000 GT", Int(0)),
                ("PEXPIRE {k} 50000 LT", Int(1)),
                ("TTL {k}", IntIn(49, 50)),
                ("PEXPIRE {k2} 100", Int(0)),
            ],
        ),
        // PERSIST
        case(
            "persist removes an expiry",
            &[
                ("PERSIST {k}", Int(0)),
                ("SET {k} a", Ok),
                ("PERSIST {k}", Int(0)),
                ("EXPIRE {k} 100", Int(1)),
                ("PERSIST {k}", Int(1)),
                ("TTL {k}", Int(-1)),
                ("GET {k}", Bulk("a")),
                ("SET {k2} a PXAT {past_ms}", Ok),
                ("PERSIST {k2}", Int(0)),
                (
                    "PERSIST",
                    Err("ERR wrong number of arguments for 'persist' command"),
                ),
            ],
        ),
        // TTL / PTTL
        case(
            "ttl and pttl: -2 absent, -1 without expiry",
            &[
                ("TTL {k}", Int(-2)),
                ("PTTL {k}", Int(-2)),
                ("SET {k} a", Ok),
                ("TTL {k}", Int(-1)),
                ("PTTL {k}", Int(-1)),
                (
                    "TTL",
                    Err("ERR wrong number of arguments for 'ttl' command"),
                ),
                (
                    "PTTL {k} {k}",
                    Err("ERR wrong number of arguments for 'pttl' command"),
                ),
            ],
        ),
        // Connection commands.
        case(
            "ping and echo",
            &[
                ("PING", Status("PONG")),
                ("PING hello", Bulk("hello")),
                ("ping {empty}", Bulk("{empty}")),
                (
                    "PING a b",
                    Err("ERR wrong number of arguments for 'ping' command"),
                ),
                ("ECHO hi", Bulk("hi")),
                ("ECHO {binval}", Bulk("{binval}")),
                (
                    "ECHO",
                    Err("ERR wrong number of arguments for 'echo' command"),
                ),
            ],
        ),
        case(
            "select 0 only",
            &[
                ("SELECT 0", Ok),
                ("SELECT 1", Err("ERR DB index is out of range")),
                ("SELECT -1", Err("ERR DB index is out of range")),
                ("SELECT x", NOT_INT),
                (
                    "SELECT",
                    Err("ERR wrong number of arguments for 'select' command"),
                ),
            ],
        ),
        case(
            "client setname getname id",
            &[
                ("CLIENT GETNAME", Nil),
                ("CLIENT SETNAME worker-1", Ok),
                ("CLIENT GETNAME", Bulk("worker-1")),
                ("CLIENT SETNAME {empty}", Ok),
                ("CLIENT GETNAME", Nil),
                (
                    "CLIENT SETNAME {bin}",
                    Err("ERR Client names cannot contain spaces, newlines or special characters."),
                ),
                ("CLIENT ID", AnyInt),
                (
                    "CLIENT",
                    Err("ERR wrong number of arguments for 'client' command"),
                ),
                (
                    "CLIENT SETNAME",
                    Err("ERR wrong number of arguments for 'client|setname' command"),
                ),
                (
                    "CLIENT GETNAME x",
                    Err("ERR wrong number of arguments for 'client|getname' command"),
                ),
                (
                    "CLIENT NOSUCH x",
                    Err("ERR unknown subcommand 'NOSUCH'. Try CLIENT HELP."),
                ),
            ],
        ),
        case(
            "unknown commands are refused and the connection stays usable",
            &[
                (
                    "NOSUCHCMD",
                    Err("ERR unknown command 'NOSUCHCMD', with args beginning with: "),
                ),
                (
                    "nosuchcmd ASYNC",
                    Err("ERR unknown command 'nosuchcmd', with args beginning with: 'ASYNC' "),
                ),
                (
                    "NOSUCH a b",
                    Err("ERR unknown command 'NOSUCH', with args beginning with: 'a' 'b' "),
                ),
                (
                    "NOSUCH {long} {long}",
                    Err("ERR unknown command 'NOSUCH', with args beginning with: '{x128}' "),
                ),
                ("PING", Status("PONG")),
                ("SET {k} v", Ok),
                ("GET {k}", Bulk("v")),
            ],
        ),
        case(
            "hello switches to resp3 and back",
            &[
                ("HELLO", Hello(2)),
                ("HELLO 3", Hello(3)),
                ("GET {k}", Nil),
                ("SET {k} v GET", Nil),
                ("GET {k}", Bulk("v")),
                ("TTL {k}", Int(-1)),
                ("CLIENT GETNAME", Nil),
                ("SET {k} w NX", Nil),
                ("HELLO 2", Hello(2)),
                ("GET {k2}", Nil),
            ],
        ),
        case(
            "hello refuses bad versions and options",
            &[
                ("HELLO 4", Err("NOPROTO unsupported protocol version")),
                ("HELLO 1", Err("NOPROTO unsupported protocol version")),
                (
                    "HELLO x",
                    Err("ERR Protocol version is not an integer or out of range"),
                ),
                ("HELLO 3 FOO", Err("ERR Syntax error in HELLO option 'FOO'")),
                (
                    "HELLO 3 AUTH default",
                    Err("ERR Syntax error in HELLO option 'AUTH'"),
                ),
                ("GET {k}", Nil),
                ("HELLO 3 SETNAME hello-name", Hello(3)),
                ("CLIENT GETNAME", Bulk("hello-name")),
            ],
        ),
        case(
            "auth without a password configured",
            &[
                (
                    "AUTH x",
                    Err(
                        "ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?",
                    ),
                ),
                ("AUTH default anything", Ok),
                (
                    "AUTH bob x",
                    Err("WRONGPASS invalid username-password pair or user is disabled."),
                ),
                ("AUTH a b c", SYNTAX),
                (
                    "AUTH",
                    Err("ERR wrong number of arguments for 'auth' command"),
                ),
            ],
        ),
        case(
            "reset goes back to resp2 without a name",
            &[
                ("HELLO 3", Hello(3)),
                ("CLIENT SETNAME n", Ok),
                ("RESET", Status("RESET")),
                ("CLIENT GETNAME", Nil),
                ("GET {k}", Nil),
                (
                    "RESET x",
                    Err("ERR wrong number of arguments for 'reset' command"),
                ),
            ],
        ),
        case(
            "command and info answer",
            &[
                ("COMMAND COUNT", AnyInt),
                ("COMMAND DOCS", MapOrArray),
                ("INFO", BulkContaining("redis_version:")),
                ("INFO server", BulkContaining("redis_version:")),
                ("PING", Status("PONG")),
            ],
        ),
        case(
            "quit answers ok and closes",
            &[("QUIT", Expect::OkThenClosed)],
        ),
    ];
    let mut setinfo = case(
        "client setinfo (redis 7.2)",
        &[
            ("CLIENT SETINFO lib-name redis-py", Ok),
            ("CLIENT SETINFO LIB-VER 5.0.1", Ok),
            (
                "CLIENT SETINFO lib-name {bin}",
                Err("ERR lib-name cannot contain spaces, newlines or special characters."),
            ),
            ("CLIENT SETINFO foo x", Err("ERR Unrecognized option 'foo'")),
            (
                "CLIENT SETINFO lib-name",
                Err("ERR wrong number of arguments for 'client|setinfo' command"),
            ),
        ],
    );
    setinfo.since = (7, 2);
    all.push(setinfo);
    let mut subset = case(
        "redis commands outside the subset are refused as unknown",
        &[
            (
                "FLUSHALL",
                Err("ERR unknown command 'FLUSHALL', with args beginning with: "),
            ),
            (
                "flushall ASYNC",
                Err("ERR unknown command 'flushall', with args beginning with: 'ASYNC' "),
            ),
            (
                "KEYS *",
                Err("ERR unknown command 'KEYS', with args beginning with: '*' "),
            ),
            (
                "INCR {k}",
                Err("ERR unknown command 'INCR', with args beginning with: '{k}' "),
            ),
            (
                "MULTI",
                Err("ERR unknown command 'MULTI', with args beginning with: "),
            ),
            (
                "CLIENT KILL x",
                Err("ERR unknown subcommand 'KILL'. Try CLIENT HELP."),
            ),
            (
                "EVAL {long} 0",
                Err("ERR unknown command 'EVAL', with args beginning with: '{x128}' "),
            ),
            ("PING", Status("PONG")),
            ("SET {k} v", Ok),
            ("GET {k}", Bulk("v")),
        ],
    );
    subset.dedupd_only = true;
    all.push(subset);
    all
}

/// The password both servers of the authentication cases require.
pub const PASSWORD: &str = "resp-test-token-0123456789";

/// Cases for a server that requires a password ([`PASSWORD`]).
pub fn auth_cases() -> Vec<Case> {
    let noauth = Err("NOAUTH Authentication required.");
    let wrongpass = Err("WRONGPASS invalid username-password pair or user is disabled.");
    vec![
        case(
            "before auth only auth, hello, quit and reset run",
            &[
                ("GET {k}", noauth.clone()),
                ("SET {k} v", noauth.clone()),
                ("PING", noauth.clone()),
                ("DEL {k}", noauth.clone()),
                ("CLIENT ID", noauth.clone()),
                (
                    "GET",
                    Err("ERR wrong number of arguments for 'get' command"),
                ),
                (
                    "NOSUCHCMD",
                    Err("ERR unknown command 'NOSUCHCMD', with args beginning with: "),
                ),
                (
                    "HELLO 3",
                    Err(
                        "NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time",
                    ),
                ),
                ("RESET", Status("RESET")),
                ("GET {k}", noauth.clone()),
            ],
        ),
        case(
            "auth with a wrong password or user is refused",
            &[
                ("AUTH wrong-password-123456", wrongpass.clone()),
                ("AUTH default wrong", wrongpass.clone()),
                ("AUTH bob resp-test-token-0123456789", wrongpass.clone()),
                ("GET {k}", noauth.clone()),
                ("HELLO 3 AUTH default wrong", wrongpass.clone()),
                ("GET {k}", noauth.clone()),
            ],
        ),
        case(
            "auth with the token lets commands run, reset forgets it",
            &[
                ("AUTH resp-test-token-0123456789", Ok),
                ("SET {k} v", Ok),
                ("GET {k}", Bulk("v")),
                ("AUTH wrong-password-123456", wrongpass),
                ("GET {k}", Bulk("v")),
                ("RESET", Status("RESET")),
                ("GET {k}", noauth.clone()),
                ("AUTH default resp-test-token-0123456789", Ok),
                ("GET {k}", Bulk("v")),
            ],
        ),
        case(
            "hello 3 auth authenticates and switches",
            &[
                ("HELLO 3 AUTH default resp-test-token-0123456789", Hello(3)),
                ("GET {k2}", Nil),
                ("SET {k2} v", Ok),
            ],
        ),
        case("quit works before auth", &[("QUIT", Expect::OkThenClosed)]),
    ]
}
