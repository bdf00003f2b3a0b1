//! The circuit breaker: a failing destination pauses its source, and one
//! probe tests recovery.

use std::time::Duration;

use crate::support::gateway::body;
use crate::support::gateway::gateway_app;
use crate::support::receiver::Behaviour;
use crate::support::receiver::Receiver;
use crate::support::receiver::eventually;
#[tokio::test]
async fn a_failing_destination_pauses_its_source_and_one_probe_tests_recovery() {
    let receiver = Receiver::start(Behaviour::Always(503)).await;
    let app = gateway_app(&receiver.url, |s| {
        s.pause_after = 3;
        s.max_in_flight = 1;
        s.max_attempts = 100;
    })
    .await;
    for i in 0..6 {
        app.ingest_ok(&body(
            &format!("e{i}"),
            &format!("run_{i}"),
            "2026-11-29T10:00:00Z",
        ))
        .await;
    }
    // The clock stands still: after three failures the source pauses, and
    // nothing else is tried while it is paused.
    eventually("paused after three failures", || async {
        app.source_state("sume").await["delivery"]["state"] == "paused"
    })
    .await;
    assert_eq!(receiver.received().len(), 3);
    let state = app.source_state("sume").await;
    assert_eq!(state["delivery"]["consecutive_failures"], 3, "{state}");
    let attempts: u64 = app
        .events("pending")
        .await
        .iter()
        .map(|e| e["attempts"].as_u64().unwrap())
        .sum();
    assert_eq!(attempts, 3, "the waiting events kept their attempts");

    // The pause (backoff_min, 10 ms) ends: one probe, which fails, and the
    // source pauses again.
    app.clock.advance(Duration::from_millis(10));
    eventually("one probe was sent", || async {
        receiver.received().len() == 4
    })
    .await;
    eventually("paused again", || async {
        app.source_state("sume").await["delivery"]["state"] == "paused"
    })
    .await;
    assert_eq!(receiver.received().len(), 4, "a single probe");

    // The destination recovers: the next probe succeeds and everything goes.
    receiver.set(Behaviour::Accept);
    app.retrying_until("all delivered", || async {
        app.event_ids("delivered").await.len() == 6
    })
    .await;
    assert_eq!(
        app.source_state("sume").await["delivery"]["state"],
        "running"
    );
    let delivered = app.events("delivered").await;
    let untried = delivered.iter().filter(|e| e["attempts"] == 1).count();
    assert!(
        untried >= 2,
        "events never tried while paused needed one attempt: {delivered:?}"
    );
}
