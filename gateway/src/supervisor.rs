//! The supervisor: starts each worker process (re-executing the `ringserve` binary), waits until it
//! is ready, hands it to the router, and restarts it with backoff when it dies. A worker found hung
//! (alive, heartbeat stale: see [`link::reader`]) is SIGKILLed and restarted the same way.
//!
//! The gateway creates both rings of a worker under fresh names (so a restarted worker never sees a
//! dead one's records), keeps the request ring's producer end and the response ring's consumer end,
//! and passes the name prefix to the worker. On every exit path the rings are dropped, which
//! unlinks their segments.
//!
//! A slot of several processes (`tensor_parallel_size > 1`) is a tensor-parallel group, supervised
//! as one unit by [`crate::group`].

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};
use tokio::sync::watch;

use crate::health::Health;
use crate::link::{self, ReaderEnd, RingReader, WorkerLink};
use crate::metrics as m;
use crate::pipeline::Shared;

/// How to start a worker process.
#[derive(Debug, Clone)]
pub struct WorkerCommand {
    /// The binary (normally `std::env::current_exe()`).
    pub exe: PathBuf,
    /// Arguments before `--rings NAME` (e.g. `worker --model DIR --device cpu ...`).
    pub args: Vec<String>,
    /// Capacity of each ring in bytes (power of two).
    pub ring_capacity: usize,
    /// Prefix of the rings' names (unique per gateway process).
    pub ring_prefix: String,
    /// Ranks per worker group (tensor parallelism); 1: one process per worker slot.
    pub tensor_parallel_size: usize,
    /// GPUs (`CUDA_VISIBLE_DEVICES` values) of the worker processes, in process order (group by
    /// group, rank by rank); empty: the environment is inherited.
    pub gpus: Vec<String>,
    /// A live worker whose heartbeat is older than this is hung: it is killed and restarted.
    pub heartbeat_timeout: Duration,
}

impl WorkerCommand {
    /// The `CUDA_VISIBLE_DEVICES` setting of worker process `index` (`slot · T + rank`), if
    /// `gpus` assigns one.
    pub fn gpu_env(&self, index: usize) -> Option<(&'static str, &str)> {
        self.gpus
            .get(index)
            .map(|gpu| ("CUDA_VISIBLE_DEVICES", gpu.as_str()))
    }
}

/// Backoff between restarts: doubles from 100 ms up to 5 s, reset after a worker lived 30 s.
#[derive(Debug, Clone, Copy)]
struct Backoff {
    next: Duration,
}

impl Backoff {
    const MIN: Duration = Duration::from_millis(100);
    const MAX: Duration = Duration::from_secs(5);

    fn after(&mut self, lived: Duration) -> Duration {
        if lived > Duration::from_secs(30) {
            self.next = Self::MIN;
        }
        let d = self.next;
        self.next = (self.next * 2).min(Self::MAX);
        d
    }
}

/// Runs worker `slot` until `shutdown` turns true.
pub async fn supervise(
    slot: usize,
    cmd: WorkerCommand,
    shared: Arc<Shared>,
    health: Health,
    mut shutdown: watch::Receiver<bool>,
) {
    // A tensor-parallel group is started, watched and restarted as one unit (`group`).
    let group = cmd.tensor_parallel_size > 1;
    let mut backoff = Backoff { next: Backoff::MIN };
    let mut generation = 0u32;
    loop {
        if *shutdown.borrow() {
            return;
        }
        let started = Instant::now();
        let run = if group {
            crate::group::run_group_once(slot, generation, &cmd, &shared, &health, &mut shutdown)
                .await
        } else {
            run_once(slot, generation, &cmd, &shared, &health, &mut shutdown).await
        };
        match run {
            Ok(Stop::Shutdown) => return,
            Ok(Stop::Died) => {}
            // Drained on request (SIGTERM) and exited cleanly (for a group: rank 0 drained and the
            // followers followed its shutdown record): replace it without delay.
            Ok(Stop::Left) => {
                // Relaxed: a plain flag. The whole service is going down (SIGTERM to the process
                // group drains the workers too): do not replace a worker that left on purpose.
                if shared.draining.load(Ordering::Relaxed) {
                    let _ = shutdown.changed().await;
                    return;
                }
                backoff.next = Backoff::MIN;
            }
            Err(e) => tracing::error!(worker = slot, group, error = %e, "worker failed to start"),
        }
        generation += 1;
        metrics::counter!(m::WORKER_RESTARTS).increment(1);
        let wait = backoff.after(started.elapsed());
        tracing::warn!(worker = slot, group, ?wait, "restarting worker");
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            _ = shutdown.changed() => return,
        }
    }
}

pub(crate) enum Stop {
    Shutdown,
    Died,
    /// Exited with status 0 (after draining).
    Left,
}

async fn run_once(
    slot: usize,
    generation: u32,
    cmd: &WorkerCommand,
    shared: &Arc<Shared>,
    health: &Health,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<Stop, String> {
    let prefix = format!("{}-w{slot}g{generation}", cmd.ring_prefix);
    let req_name = format!("{prefix}-req");
    let resp_name = format!("{prefix}-resp");
    let req = ringbuf::create(&req_name, cmd.ring_capacity).map_err(|e| e.to_string())?;
    let resp = ringbuf::create(&resp_name, cmd.ring_capacity).map_err(|e| e.to_string())?;
    let producer = req.producer().map_err(|e| e.to_string())?;
    let consumer = resp.consumer().map_err(|e| e.to_string())?;
    let mut child = Command::new(&cmd.exe)
        .args(&cmd.args)
        .arg("--rings")
        .arg(&prefix)
        .envs(cmd.gpu_env(slot))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("spawning {}: {e}", cmd.exe.display()))?;
    let pid = child.id().unwrap_or(0);
    tracing::info!(worker = slot, pid, rings = %prefix, "worker started");

    // The reader thread first waits for the Hello, then reads tokens until the worker dies.
    let mut reader = RingReader::spawn(slot, consumer, link::READY_TIMEOUT, cmd.heartbeat_timeout)
        .map_err(|e| e.to_string())?;

    let hello = tokio::select! {
        h = &mut reader.hello => h,
        status = child.wait() => {
            reader.join().await;
            return Err(format!("worker exited before it was ready: {status:?}"));
        }
        _ = shutdown.changed() => {
            kill(&mut child).await;
            reader.join().await;
            return Ok(Stop::Shutdown);
        }
    };
    let info = match hello {
        Ok(Ok(Some(info))) => info,
        other => {
            kill(&mut child).await;
            reader.join().await;
            return Err(match other {
                Ok(Ok(_)) => "worker did not become ready in time".into(),
                Ok(Err(e)) => format!("worker's hello: {e}"),
                Err(_) => "reader thread ended".into(),
            });
        }
    };
    let link = WorkerLink::new(slot, info, producer);
    reader.serve(link.clone());
    health.set_worker(shared, slot, Some(link.clone())).await;
    tracing::info!(
        worker = slot,
        pid = info.pid,
        max_model_len = info.max_model_len,
        kv_blocks = info.num_kv_blocks,
        "worker ready"
    );
    // Tests and tools read this line.
    println!("worker {slot} ready pid={}", info.pid);

    let result = tokio::select! {
        status = child.wait() => exited(slot, status),
        end = &mut reader.end => match end {
            Ok(ReaderEnd::Hung | ReaderEnd::Corrupt) => {
                // Its requests already resume elsewhere (the reader marked the link dead).
                tracing::warn!(worker = slot, pid, ?end, "killing the worker");
                kill(&mut child).await;
                Stop::Died
            }
            // It left its ring or died: its exit follows.
            _ => exited(slot, child.wait().await),
        },
        _ = shutdown.changed() => {
            kill(&mut child).await;
            Stop::Shutdown
        }
    };
    // The process is gone: fail what it had in flight and take it out of rotation.
    link.mark_dead();
    health.set_worker(shared, slot, None).await;
    reader.join().await;
    // Dropping the link and the rings here unlinks both segments.
    drop(link);
    drop((req, resp));
    Ok(result)
}

fn exited(slot: usize, status: std::io::Result<std::process::ExitStatus>) -> Stop {
    match status {
        Ok(s) if s.success() => {
            tracing::info!(worker = slot, "worker left (drained)");
            metrics::counter!(m::WORKERS_DRAINED).increment(1);
            Stop::Left
        }
        status => {
            tracing::warn!(worker = slot, ?status, "worker exited");
            Stop::Died
        }
    }
}

/// SIGKILLs the child (a stopped or hung process included) and reaps it.
pub(crate) async fn kill(child: &mut Child) {
    let _ = child.start_kill();
    let _ = child.wait().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_caps_and_resets() {
        let mut b = Backoff { next: Backoff::MIN };
        let short = Duration::from_secs(1);
        let waits: Vec<_> = (0..8).map(|_| b.after(short)).collect();
        assert_eq!(waits[0], Duration::from_millis(100));
        assert_eq!(waits[1], Duration::from_millis(200));
        assert_eq!(*waits.last().unwrap(), Backoff::MAX);
        assert_eq!(b.after(Duration::from_secs(60)), Backoff::MIN);
    }
}
