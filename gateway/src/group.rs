//! Supervision of tensor-parallel worker groups: a group of `T` worker processes is the unit that
//! is started, routed to, and restarted.
//!
//! Only rank 0 has rings to the gateway and a slot in the router; ranks 1..T-1 receive their work
//! from rank 0 (`--tp-group NAME` names the group's plan rings and communicator segment, all under
//! `{rings}-tp`). When any rank exits, the group cannot compute: the supervisor marks the group's
//! link dead (its in-flight requests resume on another live group, or wait for this one), kills the
//! other ranks, unlinks every segment of the group, and restarts the whole group with the usual
//! backoff. Other groups keep serving.

use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use tokio::process::{Child, Command};
use tokio::sync::watch;

use crate::health::Health;
use crate::link::{self, RingReader, WorkerLink};
use crate::metrics as m;
use crate::pipeline::Shared;
use crate::supervisor::{Stop, WorkerCommand, kill};

/// How often the ranks' exit status is polled.
const POLL: Duration = Duration::from_millis(50);

/// The group's shared-memory segments (plan rings, communicator): unlinked when dropped, after
/// the ranks are gone (a SIGKILLed rank 0 cannot unlink its own).
struct GroupSegments {
    prefix: String,
}

impl Drop for GroupSegments {
    fn drop(&mut self) {
        let removed = remove_segments(Path::new("/dev/shm"), &self.prefix);
        if removed > 0 {
            tracing::debug!(prefix = %self.prefix, removed, "unlinked worker group segments");
        }
    }
}

/// Removes every entry of `dir` whose name starts with `prefix`; returns how many. Unlinking a
/// POSIX shm name is removing its file under `/dev/shm`; mappings stay valid until unmapped.
fn remove_segments(dir: &Path, prefix: &str) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        if name.to_string_lossy().starts_with(prefix) {
            match std::fs::remove_file(entry.path()) {
                Ok(()) => removed += 1,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => tracing::warn!(segment = ?name, error = %e, "cannot unlink segment"),
            }
        }
    }
    removed
}

/// Waits until one of `ranks` exits; returns its rank and status. Cancel-safe.
/// How a group ended when its first rank exited: cleanly after a drain (rank 0 exits 0 once the
/// gateway released it; the followers follow its shutdown record), or not.
fn group_exited(slot: usize, rank: usize, status: std::io::Result<ExitStatus>) -> Stop {
    match status {
        Ok(s) if s.success() => {
            tracing::info!(group = slot, rank, "worker group left (drained)");
            metrics::counter!(m::WORKERS_DRAINED).increment(1);
            Stop::Left
        }
        status => {
            tracing::warn!(
                group = slot,
                rank,
                ?status,
                "a rank exited: stopping its group"
            );
            Stop::Died
        }
    }
}

async fn first_exit(ranks: &mut [Child]) -> (usize, std::io::Result<ExitStatus>) {
    loop {
        for (rank, child) in ranks.iter_mut().enumerate() {
            match child.try_wait() {
                Ok(Some(status)) => return (rank, Ok(status)),
                Ok(None) => {}
                Err(e) => return (rank, Err(e)),
            }
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Kills every rank still running and reaps them all.
async fn kill_all(ranks: &mut [Child]) {
    for child in ranks.iter_mut() {
        let _ = child.start_kill();
    }
    for child in ranks.iter_mut() {
        kill(child).await;
    }
}

/// The arguments of rank `rank` of a group of `world` (after `cmd.args`).
fn rank_args(world: usize, rank: usize, group: &str, rings: &str) -> Vec<String> {
    let mut args = vec![
        "--tensor-parallel-size".to_owned(),
        world.to_string(),
        "--rank".into(),
        rank.to_string(),
        "--tp-group".into(),
        group.into(),
    ];
    if rank == 0 {
        args.extend(["--rings".into(), rings.into()]);
    }
    args
}

/// Starts group `slot` (generation `generation`), serves until a rank exits or `shutdown` turns
/// true, then stops every rank; [`crate::supervisor::supervise`] restarts it.
pub(crate) async fn run_group_once(
    slot: usize,
    generation: u32,
    cmd: &WorkerCommand,
    shared: &Arc<Shared>,
    health: &Health,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<Stop, String> {
    let world = cmd.tensor_parallel_size;
    let prefix = format!("{}-w{slot}g{generation}", cmd.ring_prefix);
    let group = format!("{prefix}-tp");
    // Declared before the ranks, so dropped (unlinked) after them on every path.
    let _segments = GroupSegments {
        prefix: format!("{group}-"),
    };
    let req =
        ringbuf::create(&format!("{prefix}-req"), cmd.ring_capacity).map_err(|e| e.to_string())?;
    let resp =
        ringbuf::create(&format!("{prefix}-resp"), cmd.ring_capacity).map_err(|e| e.to_string())?;
    let producer = req.producer().map_err(|e| e.to_string())?;
    let consumer = resp.consumer().map_err(|e| e.to_string())?;
    let mut ranks = Vec::with_capacity(world);
    for rank in 0..world {
        let child = Command::new(&cmd.exe)
            .args(&cmd.args)
            .args(rank_args(world, rank, &group, &prefix))
            .envs(cmd.gpu_env(slot * world + rank))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("spawning {} (rank {rank}): {e}", cmd.exe.display()))?;
        ranks.push(child);
    }
    let pids: Vec<String> = ranks
        .iter()
        .map(|c| c.id().unwrap_or(0).to_string())
        .collect();
    let pids = pids.join(",");
    tracing::info!(group = slot, pids = %pids, rings = %prefix, "worker group started");

    // The reader thread first waits for rank 0's Hello, then reads tokens until it dies.
    let mut reader = RingReader::spawn(slot, consumer, link::READY_TIMEOUT, cmd.heartbeat_timeout)
        .map_err(|e| e.to_string())?;

    let hello = tokio::select! {
        h = &mut reader.hello => h,
        (rank, status) = first_exit(&mut ranks) => {
            kill_all(&mut ranks).await;
            reader.join().await;
            return Err(format!("rank {rank} exited before the group was ready: {status:?}"));
        }
        _ = shutdown.changed() => {
            kill_all(&mut ranks).await;
            reader.join().await;
            return Ok(Stop::Shutdown);
        }
    };
    let info = match hello {
        Ok(Ok(Some(info))) => info,
        other => {
            kill_all(&mut ranks).await;
            reader.join().await;
            return Err(match other {
                Ok(Ok(_)) => "the group did not become ready in time".into(),
                Ok(Err(e)) => format!("rank 0's hello: {e}"),
                Err(_) => "reader thread ended".into(),
            });
        }
    };
    let link = WorkerLink::new(slot, info, producer);
    reader.serve(link.clone());
    health.set_worker(shared, slot, Some(link.clone())).await;
    tracing::info!(
        group = slot,
        pids = %pids,
        max_model_len = info.max_model_len,
        kv_blocks = info.num_kv_blocks,
        "worker group ready"
    );
    // Tests and tools read this line (`ranks=` lists every rank's pid, rank 0 first).
    println!("worker {slot} ready pid={} ranks={pids}", info.pid);

    let result = tokio::select! {
        (rank, status) = first_exit(&mut ranks) => group_exited(slot, rank, status),
        end = &mut reader.end => match end {
            // Rank 0's heartbeat went stale (a stopped or stuck rank 0; a stuck follower stalls
            // rank 0's collectives, so it shows up the same way once `--long-step-timeout`
            // passes) or it wrote garbage: the whole group is killed below.
            Ok(link::ReaderEnd::Hung | link::ReaderEnd::Corrupt) => {
                tracing::warn!(group = slot, pids = %pids, ?end, "killing the worker group");
                Stop::Died
            }
            // Rank 0 left its ring or died: its exit follows.
            _ => {
                let (rank, status) = first_exit(&mut ranks).await;
                group_exited(slot, rank, status)
            }
        },
        _ = shutdown.changed() => Stop::Shutdown,
    };
    // The group cannot compute without every rank: take it out of rotation (its in-flight
    // requests resume elsewhere), then stop the other ranks.
    link.mark_dead();
    health.set_worker(shared, slot, None).await;
    kill_all(&mut ranks).await;
    reader.join().await;
    // Dropping the link and the rings unlinks the gateway's two segments; `_segments` then
    // unlinks the plan rings and the communicator.
    drop(link);
    drop((req, resp));
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_rank_0_gets_the_gateway_rings() {
        let zero = rank_args(2, 0, "p-tp", "p");
        assert_eq!(
            zero,
            [
                "--tensor-parallel-size",
                "2",
                "--rank",
                "0",
                "--tp-group",
                "p-tp",
                "--rings",
                "p"
            ]
        );
        let one = rank_args(2, 1, "p-tp", "p");
        assert_eq!(
            one,
            [
                "--tensor-parallel-size",
                "2",
                "--rank",
                "1",
                "--tp-group",
                "p-tp"
            ]
        );
    }

    #[test]
    fn removes_only_the_group_segments() {
        let dir = std::env::temp_dir().join(format!("rs-group-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for name in [
            "g-w0g0-tp-comm",
            "g-w0g0-tp-plan1",
            "g-w0g0-req",
            "g-w1g0-tp-comm",
        ] {
            std::fs::write(dir.join(name), b"x").unwrap();
        }
        assert_eq!(remove_segments(&dir, "g-w0g0-tp-"), 2);
        let mut left: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["g-w0g0-req", "g-w1g0-tp-comm"]);
        assert_eq!(remove_segments(&dir, "g-w0g0-tp-"), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn gpus_are_assigned_per_process() {
        let cmd = WorkerCommand {
            exe: "ringserve".into(),
            args: Vec::new(),
            ring_capacity: 1 << 16,
            ring_prefix: "p".into(),
            tensor_parallel_size: 1,
            gpus: vec!["2".into(), "5".into()],
            heartbeat_timeout: Duration::from_secs(1),
        };
        assert_eq!(cmd.gpu_env(0), Some(("CUDA_VISIBLE_DEVICES", "2")));
        assert_eq!(cmd.gpu_env(1), Some(("CUDA_VISIBLE_DEVICES", "5")));
        assert_eq!(cmd.gpu_env(2), None);
        let none = WorkerCommand {
            gpus: Vec::new(),
            ..cmd
        };
        assert_eq!(none.gpu_env(0), None);
    }
}
