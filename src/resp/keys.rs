//! SET, GET, DEL / UNLINK, EXISTS: Redis's string semantics over the
//! keyspace in the redb file.

use bytes::Bytes;

use super::Context;
use super::command::{
    MAX_KEY_BYTES, MAX_VALUE_BYTES, Step, is, not_an_integer, parse_i64, store_error, syntax_error,
};
use super::reply::Reply;
use crate::clock::Millis;
use crate::store::keyspace::{KvRequest, KvResponse, SetCondition, SetExpiry};

/// The expiry option of a SET, before it is made absolute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ExpiryOption {
    /// None given: the old expiry goes.
    Clear,
    /// KEEPTTL.
    Keep,
    /// EX seconds.
    Ex,
    /// PX milliseconds.
    Px,
    /// EXAT Unix seconds.
    ExAt,
    /// PXAT Unix milliseconds.
    PxAt,
}

/// A parsed SET.
#[derive(Debug)]
struct SetOptions {
    condition: SetCondition,
    get: bool,
    expiry: ExpiryOption,
    /// The number after EX/PX/EXAT/PXAT.
    amount: Option<Bytes>,
}

/// Parses SET's options the way Redis does: NX and XX exclude each other,
/// KEEPTTL and the four expiry options exclude each other (one of them
/// repeated is allowed: the last wins), an expiry option needs its number.
fn parse_set(args: &[Bytes]) -> Result<SetOptions, Reply> {
    let mut o = SetOptions {
        condition: SetCondition::Always,
        get: false,
        expiry: ExpiryOption::Clear,
        amount: None,
    };
    let mut j = 3;
    while j < args.len() {
        let opt = &args[j];
        let next = args.get(j + 1);
        let timed =
            |this: ExpiryOption| matches!(o.expiry, ExpiryOption::Clear) || o.expiry == this;
        if is(opt, "nx") && o.condition != SetCondition::IfPresent {
            o.condition = SetCondition::IfAbsent;
        } else if is(opt, "xx") && o.condition != SetCondition::IfAbsent {
            o.condition = SetCondition::IfPresent;
        } else if is(opt, "get") {
            o.get = true;
        } else if is(opt, "keepttl") && timed(ExpiryOption::Keep) {
            o.expiry = ExpiryOption::Keep;
        } else if let Some((this, n)) = [
            ("ex", ExpiryOption::Ex),
            ("px", ExpiryOption::Px),
            ("exat", ExpiryOption::ExAt),
            ("pxat", ExpiryOption::PxAt),
        ]
        .into_iter()
        .find(|(name, this)| is(opt, name) && timed(*this))
        .map(|(_, this)| this)
        .zip(next)
        {
            o.expiry = this;
            o.amount = Some(n.clone());
            j += 1;
        } else {
            return Err(syntax_error());
        }
        j += 1;
    }
    Ok(o)
}

/// The absolute expiry of a SET at `now`, or Redis's error for its
/// number.
fn set_expiry(o: &SetOptions, now: Millis) -> Result<SetExpiry, Reply> {
    let invalid = || Reply::err("invalid expire time in 'set' command");
    let amount = match (&o.expiry, &o.amount) {
        (ExpiryOption::Clear, _) => return Ok(SetExpiry::Clear),
        (ExpiryOption::Keep, _) => return Ok(SetExpiry::Keep),
        (_, Some(a)) => parse_i64(a).ok_or_else(not_an_integer)?,
        (_, None) => return Err(syntax_error()),
    };
    let seconds = matches!(o.expiry, ExpiryOption::Ex | ExpiryOption::ExAt);
    if amount <= 0 || (seconds && amount > i64::MAX / 1000) {
        return Err(invalid());
    }
    let ms = if seconds { amount * 1000 } else { amount };
    let at = match o.expiry {
        ExpiryOption::Ex | ExpiryOption::Px => i64::try_from(now)
            .ok()
            .and_then(|now| ms.checked_add(now))
            .ok_or_else(invalid)?,
        _ => ms,
    };
    Ok(SetExpiry::At(at))
}

/// The error for a key longer than dedupd stores.
fn key_too_long() -> Reply {
    Reply::err(format!(
        "key is too long: dedupd stores keys of at most {MAX_KEY_BYTES} bytes"
    ))
}

/// `SET key value [NX|XX] [GET] [EX s|PX ms|EXAT ts|PXAT ts|KEEPTTL]`.
pub async fn set(ctx: &Context, args: &[Bytes]) -> Step {
    let now = ctx.clock.now_ms();
    let options = match parse_set(args) {
        Ok(o) => o,
        Err(e) => return Step::Reply(e),
    };
    let expiry = match set_expiry(&options, now) {
        Ok(e) => e,
        Err(e) => return Step::Reply(e),
    };
    if args[1].len() > MAX_KEY_BYTES {
        return Step::Reply(key_too_long());
    }
    if args[2].len() > MAX_VALUE_BYTES {
        return Step::Reply(Reply::err(format!(
            "value is too large: dedupd stores values of at most {MAX_VALUE_BYTES} bytes"
        )));
    }
    let get = options.get;
    let request = KvRequest::Set {
        key: args[1].to_vec(),
        value: args[2].to_vec(),
        condition: options.condition,
        expiry,
        get,
    };
    write(ctx, request, now, move |r| match r {
        KvResponse::Set { old, .. } if get => old.map_or(Reply::Null, |v| Reply::Bulk(v.into())),
        KvResponse::Set { written: true, .. } => Reply::OK,
        _ => Reply::Null,
    })
    .await
}

/// `GET key`.
pub async fn get(ctx: &Context, args: &[Bytes]) -> Reply {
    let now = ctx.clock.now_ms();
    match ctx.keyspace.get(args[1].to_vec(), now).await {
        Ok(Some(e)) => Reply::Bulk(e.value.into()),
        Ok(None) => Reply::Null,
        Err(e) => store_error(&e),
    }
}

/// `DEL key [key …]` and `UNLINK`: how many existed.
pub async fn del(ctx: &Context, args: &[Bytes]) -> Step {
    let now = ctx.clock.now_ms();
    let request = KvRequest::Delete {
        keys: args[1..].iter().map(|k| k.to_vec()).collect(),
    };
    write(ctx, request, now, count).await
}

/// `EXISTS key [key …]`: how many exist, a repeated key each time.
pub async fn exists(ctx: &Context, args: &[Bytes]) -> Reply {
    let now = ctx.clock.now_ms();
    let keys = args[1..].iter().map(|k| k.to_vec()).collect();
    match ctx.keyspace.count(keys, now).await {
        Ok(n) => Reply::Int(i64::try_from(n).unwrap_or(i64::MAX)),
        Err(e) => store_error(&e),
    }
}

/// A count answer as an integer reply.
pub fn count(r: KvResponse) -> Reply {
    match r {
        KvResponse::Count(n) => Reply::Int(i64::try_from(n).unwrap_or(i64::MAX)),
        KvResponse::Set { .. } => Reply::err("the store answered a count with a SET answer"),
    }
}

/// Queues `request` at the writer; the reply is `answer` of its outcome
/// once committed.
pub async fn write(
    ctx: &Context,
    request: KvRequest,
    now: Millis,
    answer: impl FnOnce(KvResponse) -> Reply + Send + 'static,
) -> Step {
    match ctx.keyspace.submit(request, now).await {
        Ok(committed) => Step::Write(Box::pin(async move {
            match committed.await {
                Ok(r) => answer(r),
                Err(e) => store_error(&e),
            }
        })),
        Err(e) => Step::Reply(store_error(&e)),
    }
}
