//! Answers to an HTTP worker thread's writes, handed over with one wake a
//! batch instead of one a write.
//!
//! A write's caller awaits its answer on a oneshot channel. Answered from
//! the writer thread, each answer wakes its caller's task from another
//! thread: the worker's runtime is unparked, a write to its eventfd, one
//! system call per request (measured: 407 k of them for 407 k claims, a
//! third of the server's system calls; Redis makes two per `SET`, its read
//! and its write). On a VM where a system call or a wake-up is dear, that
//! one is worth saving.
//!
//! So a worker thread that [`install`]s a [`Mailbox`] gets its answers
//! there: the writer puts a synced batch's answers in each caller's
//! mailbox and wakes each mailbox once, and a task on the worker thread
//! (the pump) sends them on, each a wake on its own thread, which costs
//! no system call. Any other caller (no mailbox, or its pump gone with its
//! runtime) is answered directly, as before; refusals and errors always
//! are.

use std::cell::RefCell;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::{Notify, oneshot};

use super::error::EngineError;
use super::ops::Response;

/// A write's answer.
pub type Answer = Result<Response, EngineError>;

/// Where a write's answer goes.
#[derive(Debug)]
pub struct Reply {
    tx: oneshot::Sender<Answer>,
    /// The caller's thread's mailbox, if it has one.
    mailbox: Option<Arc<Mailbox>>,
}

impl Reply {
    /// A reply for a caller on this thread, and the channel its answer
    /// comes on.
    pub fn for_this_thread() -> (Self, oneshot::Receiver<Answer>) {
        let (tx, rx) = oneshot::channel();
        // (While the thread's locals are being destroyed: none.)
        let mailbox = MAILBOX
            .try_with(|m| m.borrow().as_ref().filter(|m| m.open()).cloned())
            .ok()
            .flatten();
        (Self { tx, mailbox }, rx)
    }

    /// A reply answered straight on its channel, whatever the thread (the
    /// writer's own purges).
    pub fn direct() -> (Self, oneshot::Receiver<Answer>) {
        let (tx, rx) = oneshot::channel();
        (Self { tx, mailbox: None }, rx)
    }

    /// Answers at once (a refusal, an error). Gives the answer back if the
    /// caller went away.
    pub fn send(self, answer: Answer) -> Result<(), Answer> {
        self.tx.send(answer)
    }

    /// Answers through the caller's mailbox when it has one; `posted`
    /// collects the mailboxes to [`wake`] once the batch is answered.
    pub fn post(self, answer: Answer, posted: &mut Vec<Arc<Mailbox>>) {
        match self.mailbox {
            Some(mailbox) => mailbox.put(self.tx, answer, posted),
            None => {
                let _ = self.tx.send(answer);
            }
        }
    }
}

/// Wakes each mailbox that answers were posted to.
pub fn wake(posted: &mut Vec<Arc<Mailbox>>) {
    for mailbox in posted.drain(..) {
        mailbox.notify.notify_one();
    }
}

/// A worker thread's answers, waiting for its pump.
#[derive(Debug, Default)]
pub struct Mailbox {
    held: Mutex<Held>,
    /// Wakes the pump (a permit is kept if it is not waiting).
    notify: Notify,
}

#[derive(Debug, Default)]
struct Held {
    answers: Vec<(oneshot::Sender<Answer>, Answer)>,
    /// The pump is gone: answers go straight to their callers.
    closed: bool,
}

impl Mailbox {
    fn held(&self) -> MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn open(&self) -> bool {
        !self.held().closed
    }

    fn put(
        self: Arc<Self>,
        tx: oneshot::Sender<Answer>,
        answer: Answer,
        posted: &mut Vec<Arc<Mailbox>>,
    ) {
        let mut held = self.held();
        if held.closed {
            drop(held);
            let _ = tx.send(answer);
            return;
        }
        held.answers.push((tx, answer));
        drop(held);
        if !posted.iter().any(|m| Arc::ptr_eq(m, &self)) {
            posted.push(self);
        }
    }
}

thread_local! {
    /// This thread's mailbox, once [`install`]ed.
    static MAILBOX: RefCell<Option<Arc<Mailbox>>> = const { RefCell::new(None) };
}

/// Gives this thread a mailbox and starts its pump, a local task of the
/// runtime this thread runs for its whole life (an HTTP worker's, at its
/// start: `tokio::task::spawn_local` needs a local runtime or a
/// `LocalSet`). A live one is kept. The thread must never block on a
/// write's answer (`block_on`, `block_in_place`): the pump that brings it
/// runs on this thread.
pub fn install() {
    MAILBOX.with(|m| {
        let mut m = m.borrow_mut();
        if m.as_ref().is_some_and(|m| m.open()) {
            return;
        }
        let mailbox = Arc::new(Mailbox::default());
        tokio::task::spawn_local(pump(Closing(mailbox.clone())));
        *m = Some(mailbox);
    });
}

/// Closes the mailbox when the pump goes (with its runtime), answering
/// what it held directly: nothing posted is left unanswered.
struct Closing(Arc<Mailbox>);

impl Drop for Closing {
    fn drop(&mut self) {
        let left = {
            let mut held = self.0.held();
            held.closed = true;
            std::mem::take(&mut held.answers)
        };
        for (tx, answer) in left {
            let _ = tx.send(answer);
        }
    }
}

/// Sends each posted answer on, once woken: on this thread, so each wake
/// of a caller is a local one.
async fn pump(mailbox: Closing) {
    let mut taken = Vec::new();
    loop {
        mailbox.0.notify.notified().await;
        std::mem::swap(&mut taken, &mut mailbox.0.held().answers);
        for (tx, answer) in taken.drain(..) {
            let _ = tx.send(answer);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok() -> Answer {
        Ok(Response::Purged(7))
    }

    /// Posted answers reach their callers once the mailbox is woken, and
    /// not before: one wake for the batch.
    #[tokio::test]
    async fn posted_answers_arrive_after_one_wake() {
        let local = tokio::task::LocalSet::new();
        local
            .run_until(async {
                install();
                let (a, mut ra) = Reply::for_this_thread();
                let (b, rb) = Reply::for_this_thread();
                assert!(a.mailbox.is_some());
                let mut posted = Vec::new();
                a.post(ok(), &mut posted);
                b.post(ok(), &mut posted);
                assert_eq!(posted.len(), 1, "one mailbox to wake");
                tokio::task::yield_now().await;
                assert!(ra.try_recv().is_err(), "not before the wake");
                wake(&mut posted);
                assert!(matches!(ra.await, Ok(Ok(Response::Purged(7)))));
                assert!(matches!(rb.await, Ok(Ok(Response::Purged(7)))));
            })
            .await;
    }

    /// A mailbox whose pump went with its runtime answers directly, and
    /// what it held when the pump went is answered then.
    #[test]
    fn a_mailbox_without_its_pump_answers_directly() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let local = tokio::task::LocalSet::new();
        let (held, mut held_rx) = local.block_on(&rt, async {
            install();
            tokio::task::yield_now().await;
            let (reply, rx) = Reply::for_this_thread();
            let mut posted = Vec::new();
            reply.post(ok(), &mut posted);
            (posted, rx)
        });
        drop(local);
        assert!(held_rx.try_recv().is_ok(), "answered when the pump went");
        drop(held);
        // This thread's mailbox is closed: a new reply has none.
        let (reply, mut rx) = Reply::for_this_thread();
        assert!(reply.mailbox.is_none());
        reply.post(ok(), &mut Vec::new());
        assert!(rx.try_recv().is_ok());
    }

    /// Without a mailbox (another thread, the writer's own purges) the
    /// answer goes straight to the caller.
    #[test]
    fn without_a_mailbox_the_answer_goes_straight_to_the_caller() {
        let (reply, mut rx) = std::thread::spawn(Reply::for_this_thread).join().unwrap();
        assert!(reply.mailbox.is_none());
        let mut posted = Vec::new();
        reply.post(ok(), &mut posted);
        assert!(posted.is_empty());
        assert!(rx.try_recv().is_ok());
    }
}
