//! With one CPU, the process runs under `SCHED_BATCH`.
//!
//! A request passes from the thread that read it to the store's writer (and,
//! with one CPU, its syncer) and back. Under the default policy each of those
//! wake-ups may preempt the thread that made it: with one CPU the writer
//! woken by the first request of a burst runs at once, with a batch of one,
//! before the reader has read the rest. `SCHED_BATCH` is the same fair
//! scheduling at the same nice value, without that wake-up preemption: the
//! reader finishes its burst, the writer takes it as one batch. Measured
//! with the server on one core (docs/performance.md, "Claims on any VM",
//! medians of three): the Redis protocol's `SET NX EX` at 64 connections
//! went from 1.05× Redis to 1.38×, context switches per `SET` from 0.35 to
//! 0.18; claims over HTTP the same within noise. With two CPUs or more it
//! was slower, so there it is left as it is.
//!
//! Only the default policy is changed: one an operator chose (systemd's
//! `CPUSchedulingPolicy=`, `chrt`) is kept. The nice value is kept too.
//! `cpu_scheduling = "as-started"` keeps the default policy as well.

use crate::config::CpuScheduling;

/// Whether the process may use only one CPU (its affinity, a 1-vCPU VM, a
/// cgroup's quota); the store's log is then synced on a thread of its own
/// too (`RedbOptions::sync_thread`).
pub fn one_cpu() -> bool {
    std::thread::available_parallelism().is_ok_and(|n| n.get() == 1)
}

/// With one CPU and `cpu_scheduling = "auto"`, switches the calling thread
/// from the default policy to `SCHED_BATCH`; threads it starts afterwards
/// inherit it, so `serve` calls this before its runtime starts. Logs what
/// it did.
pub fn on_one_cpu(setting: CpuScheduling) {
    if !one_cpu() {
        return;
    }
    if setting == CpuScheduling::AsStarted {
        tracing::info!("one CPU: scheduled as started (cpu_scheduling = \"as-started\")");
        return;
    }
    #[cfg(target_os = "linux")]
    match batch() {
        Ok(true) => tracing::info!("one CPU: scheduling the process as SCHED_BATCH"),
        Ok(false) => tracing::info!("one CPU: the scheduling policy set for the process is kept"),
        Err(e) => tracing::warn!(error = %e, "one CPU: cannot schedule the process as SCHED_BATCH"),
    }
}

/// Switches the calling thread from `SCHED_OTHER` to `SCHED_BATCH` at the
/// same nice value; false if it had another policy (left as it was).
#[cfg(target_os = "linux")]
fn batch() -> anyhow::Result<bool> {
    use thread_priority::{
        NormalThreadSchedulePolicy, ThreadPriority, ThreadSchedulePolicy,
        set_thread_priority_and_policy, thread_native_id, thread_schedule_policy,
    };
    let other = ThreadSchedulePolicy::Normal(NormalThreadSchedulePolicy::Other);
    let batch = ThreadSchedulePolicy::Normal(NormalThreadSchedulePolicy::Batch);
    if thread_schedule_policy().map_err(|e| anyhow::anyhow!("{e:?}"))? != other {
        return Ok(false);
    }
    let nice = rustix::process::getpriority_process(None)?;
    // The crate sets the policy, then a nice value from the priority given:
    // the highest, refused without the privilege (or by the unit's system
    // call filter), so the nice value stays; with the privilege, it is put
    // back (raising a nice value needs none).
    let set = set_thread_priority_and_policy(thread_native_id(), ThreadPriority::Max, batch);
    if rustix::process::getpriority_process(None)? != nice {
        rustix::process::setpriority_process(None, nice)?;
    }
    let now = thread_schedule_policy().map_err(|e| anyhow::anyhow!("{e:?}"))?;
    if now != batch {
        anyhow::bail!("the policy is {now:?} ({set:?})");
    }
    Ok(true)
}
