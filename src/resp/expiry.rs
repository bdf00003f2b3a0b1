//! EXPIRE / PEXPIRE (with NX, XX, GT, LT), PERSIST, TTL / PTTL.

use bytes::Bytes;

use super::Context;
use super::command::{Step, is, lossy, not_an_integer, parse_i64, store_error};
use super::keys::{count, write};
use super::reply::Reply;
use crate::store::keyspace::{ExpireCondition, KvRequest};

/// Parses EXPIRE's options as Redis does: any of NX, XX, GT, LT, any
/// number of times; NX with any other, or GT with LT, is refused.
fn parse_condition(options: &[Bytes]) -> Result<ExpireCondition, Reply> {
    let (mut nx, mut xx, mut gt, mut lt) = (false, false, false, false);
    for opt in options {
        if is(opt, "nx") {
            nx = true;
        } else if is(opt, "xx") {
            xx = true;
        } else if is(opt, "gt") {
            gt = true;
        } else if is(opt, "lt") {
            lt = true;
        } else {
            return Err(Reply::err(format!("Unsupported option {}", lossy(opt))));
        }
    }
    if nx && (xx || gt || lt) {
        return Err(Reply::err(
            "NX and XX, GT or LT options at the same time are not compatible",
        ));
    }
    if gt && lt {
        return Err(Reply::err(
            "GT and LT options at the same time are not compatible",
        ));
    }
    Ok(match (nx, xx, gt, lt) {
        (true, ..) => ExpireCondition::IfNone,
        (_, _, true, _) => ExpireCondition::Later,
        (_, true, _, true) => ExpireCondition::SomeAndEarlier,
        (_, _, _, true) => ExpireCondition::Earlier,
        (_, true, ..) => ExpireCondition::IfSome,
        _ => ExpireCondition::Always,
    })
}

/// `EXPIRE key seconds [NX|XX|GT|LT]` (`unit_ms` 1000) and `PEXPIRE key
/// ms …` (`unit_ms` 1): 1 when the expiry was set (a time not in the
/// future deletes the key), 0 when the key is absent or the option
/// refused.
pub async fn expire(ctx: &Context, args: &[Bytes], unit_ms: i64, name: &str) -> Step {
    let now = ctx.clock.now_ms();
    let condition = match parse_condition(&args[3..]) {
        Ok(c) => c,
        Err(e) => return Step::Reply(e),
    };
    let Some(amount) = parse_i64(&args[2]) else {
        return Step::Reply(not_an_integer());
    };
    let at = amount
        .checked_mul(unit_ms)
        .and_then(|ms| ms.checked_add(i64::try_from(now).ok()?));
    let Some(at) = at else {
        return Step::Reply(Reply::err(format!(
            "invalid expire time in '{name}' command"
        )));
    };
    let request = KvRequest::Expire {
        key: args[1].to_vec(),
        at,
        condition,
    };
    write(ctx, request, now, count).await
}

/// `PERSIST key`: 1 when an expiry was removed.
pub async fn persist(ctx: &Context, args: &[Bytes]) -> Step {
    let now = ctx.clock.now_ms();
    let request = KvRequest::Persist {
        key: args[1].to_vec(),
    };
    write(ctx, request, now, count).await
}

/// `TTL key` (seconds, rounded) and `PTTL key` (`ms`): -2 absent, -1 no
/// expiry.
pub async fn ttl(ctx: &Context, args: &[Bytes], ms: bool) -> Reply {
    let now = ctx.clock.now_ms();
    match ctx.keyspace.get(args[1].to_vec(), now).await {
        Ok(None) => Reply::Int(-2),
        Ok(Some(e)) => match e.expires_at_ms {
            None => Reply::Int(-1),
            Some(at) => {
                let left = i64::try_from(at.saturating_sub(now)).unwrap_or(i64::MAX);
                Reply::Int(if ms {
                    left
                } else {
                    left.saturating_add(500) / 1000
                })
            }
        },
        Err(e) => store_error(&e),
    }
}
