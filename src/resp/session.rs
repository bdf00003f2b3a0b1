//! Connection commands: PING, HELLO, AUTH, SELECT, CLIENT, RESET.
//!
//! The password of `AUTH` / `HELLO … AUTH` is one of the full-access API
//! tokens (`api.tokens`; read-only ones are refused, as every connection
//! may write), for the user `default` (Redis's `requirepass`). Without
//! tokens every connection starts authenticated, as Redis without a
//! password does.

use bytes::Bytes;

use crate::auth::AuthPort;

use super::command::{is, lossy, not_an_integer, parse_i64, syntax_error, wrong_arity};
use super::reply::{Protocol, Reply};
use super::{Context, Session};

/// Redis's answer to a failed authentication.
const WRONGPASS: &str = "WRONGPASS invalid username-password pair or user is disabled.";

/// The Redis version whose semantics the listener follows, as `HELLO` and
/// `INFO` report it.
pub const REDIS_VERSION: &str = "7.2.0";

/// `PING [message]`.
pub fn ping(args: &[Bytes]) -> Reply {
    match args.len() {
        1 => Reply::Status("PONG"),
        2 => Reply::Bulk(args[1].clone()),
        _ => wrong_arity("ping"),
    }
}

/// Whether `user` / `password` authenticate: the user `default` with a
/// full-access token (any password when no token is configured). With
/// tokens, an address that failed too often is refused before its password
/// is looked at (the limiter the HTTP API shares), and each failure counts.
fn authenticates(
    ctx: &Context,
    session: &Session,
    user: &[u8],
    password: &[u8],
) -> Result<(), Reply> {
    if ctx.tokens.is_empty() {
        return if user == b"default" {
            Ok(())
        } else {
            Err(Reply::Error(WRONGPASS.into()))
        };
    }
    let limiter = ctx.tokens.limiter();
    if let Some(peer) = session.peer {
        limiter.allow(AuthPort::Resp, peer).map_err(|wait| {
            Reply::err(format!(
                "too many failed authentications from this address: try again in {} s",
                wait.secs
            ))
        })?;
    }
    let full = user == b"default"
        && std::str::from_utf8(password).is_ok_and(|p| ctx.tokens.grants_full(p));
    if full {
        return Ok(());
    }
    if let Some(peer) = session.peer {
        limiter.failed(AuthPort::Resp, peer);
    }
    Err(Reply::Error(WRONGPASS.into()))
}

/// `AUTH [user] password`.
pub fn auth(ctx: &Context, session: &mut Session, args: &[Bytes]) -> Reply {
    let (user, password): (&[u8], &[u8]) = match args.len() {
        2 if ctx.tokens.is_empty() => {
            return Reply::err(
                "AUTH <password> called without any password configured for the default user. \
                 Are you sure your configuration is correct?",
            );
        }
        2 => (b"default", &args[1]),
        3 => (&args[1], &args[2]),
        _ => return syntax_error(),
    };
    match authenticates(ctx, session, user, password) {
        Ok(()) => {
            session.authenticated = true;
            Reply::OK
        }
        Err(refusal) => refusal,
    }
}

/// `HELLO [protover [AUTH user pass] [SETNAME name]]`: switches the
/// protocol and answers with the server's description.
pub fn hello(ctx: &Context, session: &mut Session, args: &[Bytes]) -> Reply {
    let mut protocol = None;
    if let Some(v) = args.get(1) {
        match parse_i64(v) {
            None => return Reply::err("Protocol version is not an integer or out of range"),
            Some(2) => protocol = Some(Protocol::Resp2),
            Some(3) => protocol = Some(Protocol::Resp3),
            Some(_) => return Reply::Error("NOPROTO unsupported protocol version".into()),
        }
    }
    let mut j = 2;
    while j < args.len() {
        let more = args.len() - 1 - j;
        let opt = &args[j];
        if is(opt, "auth") && more >= 2 {
            if let Err(refusal) = authenticates(ctx, session, &args[j + 1], &args[j + 2]) {
                return refusal;
            }
            session.authenticated = true;
            j += 3;
        } else if is(opt, "setname") && more >= 1 {
            if let Err(e) = set_name(session, &args[j + 1]) {
                return e;
            }
            j += 2;
        } else {
            return Reply::err(format!("Syntax error in HELLO option '{}'", lossy(opt)));
        }
    }
    if !session.authenticated {
        return Reply::Error(
            "NOAUTH HELLO must be called with the client already authenticated, otherwise the \
             HELLO AUTH <user> <pass> option can be used to authenticate the client and select \
             the RESP protocol version at the same time"
                .into(),
        );
    }
    if let Some(p) = protocol {
        session.protocol = p;
    }
    Reply::Map(vec![
        (Reply::text("server"), Reply::text("dedupd")),
        (Reply::text("version"), Reply::text(REDIS_VERSION)),
        (Reply::text("proto"), Reply::Int(session.protocol.number())),
        (Reply::text("id"), Reply::Int(session.id)),
        (Reply::text("mode"), Reply::text("standalone")),
        (Reply::text("role"), Reply::text("master")),
        (Reply::text("modules"), Reply::Array(Vec::new())),
    ])
}

/// `SELECT db`: only database 0 exists.
pub fn select(args: &[Bytes]) -> Reply {
    match parse_i64(&args[1]).filter(|n| i32::try_from(*n).is_ok()) {
        None => not_an_integer(),
        Some(0) => Reply::OK,
        Some(_) => Reply::err("DB index is out of range"),
    }
}

/// Sets (or, when empty, clears) the connection's name; Redis allows
/// printable ASCII without spaces.
fn set_name(session: &mut Session, name: &Bytes) -> Result<(), Reply> {
    if name.iter().any(|&c| !(b'!'..=b'~').contains(&c)) {
        return Err(Reply::err(
            "Client names cannot contain spaces, newlines or special characters.",
        ));
    }
    session.name = (!name.is_empty()).then(|| name.clone());
    Ok(())
}

/// `CLIENT SETNAME | GETNAME | ID | SETINFO`.
pub fn client(session: &mut Session, args: &[Bytes]) -> Reply {
    let sub = &args[1];
    let (name, arity) = if is(sub, "setname") {
        ("setname", 3)
    } else if is(sub, "getname") {
        ("getname", 2)
    } else if is(sub, "id") {
        ("id", 2)
    } else if is(sub, "setinfo") {
        ("setinfo", 4)
    } else {
        return Reply::err(format!(
            "unknown subcommand '{}'. Try CLIENT HELP.",
            lossy(sub)
        ));
    };
    if args.len() != arity {
        return wrong_arity(&format!("client|{name}"));
    }
    match name {
        "setname" => match set_name(session, &args[2]) {
            Ok(()) => Reply::OK,
            Err(e) => e,
        },
        "getname" => session.name.clone().map_or(Reply::Null, Reply::Bulk),
        "id" => Reply::Int(session.id),
        _ => {
            let attr = &args[2];
            if !is(attr, "lib-name") && !is(attr, "lib-ver") {
                return Reply::err(format!("Unrecognized option '{}'", lossy(attr)));
            }
            if args[3].iter().any(|&c| !(b'!'..=b'~').contains(&c)) {
                return Reply::err(format!(
                    "{} cannot contain spaces, newlines or special characters.",
                    lossy(attr)
                ));
            }
            Reply::OK
        }
    }
}

/// `RESET`: back to RESP2, no name, and unauthenticated when tokens are
/// configured.
pub fn reset(ctx: &Context, session: &mut Session) -> Reply {
    session.protocol = Protocol::Resp2;
    session.name = None;
    session.authenticated = ctx.tokens.is_empty();
    Reply::Status("RESET")
}
