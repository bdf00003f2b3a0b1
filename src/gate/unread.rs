//! A chunked request body nobody read to its end closes its connection.
//!
//! actix-http keeps a connection open after an answer to a request whose
//! body was not read (a 408 for a body that did not arrive in time, a 413,
//! a refusal before the body is looked at) and reads on, to discard the
//! rest, when that body is chunked: a body whose end never comes held the
//! connection for ever, and a few addresses sending only the headers of
//! such requests took every connection the server has (found by an
//! attack run: no post got through). A body with a `Content-Length` is
//! not read on: actix closes the connection once the answer is out.
//!
//! It does the same for a chunked body that is unread and still wanted
//! when the answer ends. So the gate takes a chunked request's body, gives
//! the route a reader of it, and keeps the body itself with the answer
//! ([`KeepsPayload`]) until the answer has gone out.

use std::cell::RefCell;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use actix_web::HttpMessage as _;
use actix_web::body::{BodySize, MessageBody};
use actix_web::dev::{Payload, ServiceRequest};
use actix_web::error::PayloadError;
use actix_web::http::header;
use actix_web::web::Bytes;
use futures_util::StreamExt as _;
use pin_project_lite::pin_project;

/// A request's body, held by the gate for its answer.
pub type Held = Rc<RefCell<Payload>>;

/// For a chunked request: takes its body, gives the route a reader of it,
/// and returns the body to keep with the answer. Nothing for any other
/// request (no cost on the paths that send a length).
pub fn hold(req: &mut ServiceRequest) -> Option<Held> {
    if !req.headers().contains_key(header::TRANSFER_ENCODING) {
        return None;
    }
    let held: Held = Rc::new(RefCell::new(req.take_payload()));
    let reader = Rc::clone(&held);
    let stream = futures_util::stream::poll_fn(move |cx| reader.borrow_mut().poll_next_unpin(cx));
    let stream: Pin<Box<dyn futures_util::Stream<Item = Result<Bytes, PayloadError>>>> =
        Box::pin(stream);
    req.set_payload(Payload::from(stream));
    Some(held)
}

pin_project! {
    /// An answer's body, and the request's body kept with it until it has
    /// gone out (see the module doc).
    pub struct KeepsPayload<B> {
        #[pin]
        body: B,
        held: Option<Held>,
    }
}

impl<B> KeepsPayload<B> {
    pub fn new(body: B, held: Option<Held>) -> Self {
        Self { body, held }
    }
}

impl<B: MessageBody> MessageBody for KeepsPayload<B> {
    type Error = B::Error;

    fn size(&self) -> BodySize {
        self.body.size()
    }

    fn poll_next(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, Self::Error>>> {
        self.project().body.poll_next(cx)
    }
}
