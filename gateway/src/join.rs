//! Workers that join at run time: `ringserve worker --join NAME` registers with the gateway started
//! as `ringserve serve --name NAME` over a Unix socket (protocol: [`protos::join`]).
//!
//! Security: the socket lives in a folder of mode 0700 owned by the gateway's user (an existing
//! folder owned by anyone else is refused), the socket itself is mode 0600, and a peer whose
//! credentials (`SO_PEERCRED`) name another uid, or a pid other than the one it claims, is refused.
//! A registration is one line of at most [`MAX_LINE`] bytes read within [`LINE_TIMEOUT`]; anything
//! else gets an `error` line and the connection is closed — a bad peer never disturbs the gateway.
//!
//! A joined worker gets the next free slot after the supervised ones and fresh rings under the
//! gateway's ring prefix; once its Hello arrives (from the registering pid) it is routed to like
//! any other worker. It is never restarted by the gateway (its launcher owns it): when it dies,
//! hangs, or drains and leaves, its requests fail over and its slot and rings are dropped. A hung
//! joined worker is not killed; with its rings released it exits by itself should it ever resume.

use std::collections::BTreeSet;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use protos::join::{JoinError, JoinReply, JoinRequest, MAX_LINE};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;

use crate::health::Health;
use crate::link::{ReaderEnd, RingReader, WorkerLink};
use crate::metrics as m;
use crate::pipeline::Shared;

/// How long a registering peer may take to send its line.
pub const LINE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a registered worker may take to write its Hello (its model is already loaded).
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(60);
/// Joined workers at most.
pub const MAX_JOINED: usize = 64;

/// The join socket could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum JoinServerError {
    #[error(transparent)]
    Name(#[from] JoinError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is owned by uid {owner}, not by this user ({uid}); refusing to use it")]
    ForeignDir { path: PathBuf, owner: u32, uid: u32 },
    #[error("a gateway named {name:?} is already running ({path})")]
    NameInUse { name: String, path: PathBuf },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> JoinServerError + '_ {
    move |source| JoinServerError::Io {
        path: path.to_owned(),
        source,
    }
}

/// This process's effective uid (the owner of `/proc/self`).
pub fn current_uid() -> std::io::Result<u32> {
    Ok(std::fs::metadata("/proc/self")?.uid())
}

/// A socket file younger than this is never reaped: its gateway may be between `bind` and
/// `listen`.
const STALE_SOCKET_MIN_AGE: Duration = Duration::from_secs(2);

/// Removes the join sockets in `dir` that nobody listens on (their gateway died without removing
/// them) and returns their paths. Only sockets owned by this user and older than a couple of
/// seconds are touched; a live gateway's socket answers the probe and stays.
pub fn reap_stale_sockets(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let uid = current_uid()?;
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_none_or(|e| e != "sock") {
            continue;
        }
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        use std::os::unix::fs::FileTypeExt;
        let old = meta
            .modified()
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age >= STALE_SOCKET_MIN_AGE);
        if !meta.file_type().is_socket() || meta.uid() != uid || !old {
            continue;
        }
        let refused = matches!(
            std::os::unix::net::UnixStream::connect(&path),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused
        );
        if refused && std::fs::remove_file(&path).is_ok() {
            removed.push(path);
        }
    }
    Ok(removed)
}

/// The bound join socket; its file is removed on drop.
#[derive(Debug)]
pub struct JoinListener {
    listener: UnixListener,
    path: PathBuf,
    uid: u32,
}

impl JoinListener {
    /// Binds `RUNTIME_DIR/NAME.sock` (see [`protos::join::runtime_dir`]). A stale socket of a
    /// gateway that died is replaced; a live one is an error.
    pub fn bind(name: &str) -> Result<Self, JoinServerError> {
        let uid = current_uid().map_err(io_err(Path::new("/proc/self")))?;
        Self::bind_in(&protos::join::runtime_dir(uid), name)
    }

    /// Binds `DIR/NAME.sock`, creating `DIR` (mode 0700) if needed; `DIR` must belong to this user.
    pub fn bind_in(dir: &Path, name: &str) -> Result<Self, JoinServerError> {
        protos::join::check_name(name)?;
        let uid = current_uid().map_err(io_err(Path::new("/proc/self")))?;
        let path = dir.join(format!("{name}.sock"));
        let dir = dir.to_owned();
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(io_err(&dir))?;
        let meta = std::fs::symlink_metadata(&dir).map_err(io_err(&dir))?;
        if !meta.is_dir() || meta.uid() != uid {
            return Err(JoinServerError::ForeignDir {
                path: dir,
                owner: meta.uid(),
                uid,
            });
        }
        if meta.mode() & 0o077 != 0 {
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
                .map_err(io_err(&dir))?;
        }
        if std::fs::symlink_metadata(&path).is_ok() {
            if std::os::unix::net::UnixStream::connect(&path).is_ok() {
                return Err(JoinServerError::NameInUse {
                    name: name.to_owned(),
                    path,
                });
            }
            std::fs::remove_file(&path).map_err(io_err(&path))?;
        }
        let listener = UnixListener::bind(&path).map_err(io_err(&path))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
            .map_err(io_err(&path))?;
        Ok(Self {
            listener,
            path,
            uid,
        })
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for JoinListener {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// What joined workers need from the gateway.
#[derive(Debug)]
pub struct JoinContext {
    pub shared: Arc<Shared>,
    pub health: Health,
    /// The gateway's ring prefix (joined rings are `PREFIX-jSLOT...`).
    pub ring_prefix: String,
    pub ring_capacity: usize,
    pub heartbeat_timeout: Duration,
    /// The first slot after the supervised workers.
    pub first_slot: usize,
    /// Slots held by joined workers.
    used: Mutex<BTreeSet<usize>>,
    /// Registrations so far (makes ring names unique across rejoins of a slot).
    serial: std::sync::atomic::AtomicU64,
}

impl JoinContext {
    /// A context; joined slots start at `first_slot`.
    pub fn new(
        shared: Arc<Shared>,
        health: Health,
        ring_prefix: String,
        ring_capacity: usize,
        heartbeat_timeout: Duration,
        first_slot: usize,
    ) -> Self {
        Self {
            shared,
            health,
            ring_prefix,
            ring_capacity,
            heartbeat_timeout,
            first_slot,
            used: Mutex::new(BTreeSet::new()),
            serial: std::sync::atomic::AtomicU64::new(0),
        }
    }

    fn reserve_slot(&self) -> Option<usize> {
        let mut used = self.used.lock().unwrap_or_else(|e| e.into_inner());
        if used.len() >= MAX_JOINED {
            return None;
        }
        let slot = (self.first_slot..).find(|s| !used.contains(s))?;
        used.insert(slot);
        Some(slot)
    }

    fn free_slot(&self, slot: usize) {
        self.used
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&slot);
    }
}

/// Accepts registrations until `shutdown` turns true; each joined worker is served on its own task
/// until it leaves or the gateway stops.
pub async fn serve(
    listener: JoinListener,
    ctx: Arc<JoinContext>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut workers = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            conn = listener.listener.accept() => match conn {
                Ok((conn, _)) => {
                    let ctx = ctx.clone();
                    let stop = shutdown.clone();
                    let uid = listener.uid;
                    workers.spawn(handle(conn, uid, ctx, stop));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "join socket accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            _ = shutdown.changed() => break,
            Some(_) = workers.join_next(), if !workers.is_empty() => {}
        }
    }
    // Joined workers notice the shutdown themselves; wait until their rings are dropped.
    while workers.join_next().await.is_some() {}
    drop(listener);
}

/// A registration that passed every check: the worker's rings exist and the gateway holds its ends.
struct Admitted {
    slot: usize,
    pid: u32,
    prefix: String,
    rings: (ringbuf::Ring, ringbuf::Ring),
    producer: ringbuf::Producer,
    consumer: ringbuf::Consumer,
}

async fn handle(
    mut conn: UnixStream,
    uid: u32,
    ctx: Arc<JoinContext>,
    shutdown: watch::Receiver<bool>,
) {
    let admitted = admit(&mut conn, uid, &ctx).await;
    let reply = match &admitted {
        Ok(a) => JoinReply::Ok {
            slot: a.slot,
            rings: a.prefix.clone(),
        },
        Err(why) => {
            metrics::counter!(m::JOINS_REFUSED).increment(1);
            tracing::warn!(reason = %why, "join refused");
            JoinReply::Refused(why.clone())
        }
    };
    let sent = tokio::time::timeout(LINE_TIMEOUT, conn.write_all(reply.to_line().as_bytes())).await;
    drop(conn);
    let Ok(a) = admitted else { return };
    if !matches!(sent, Ok(Ok(()))) {
        tracing::warn!(
            slot = a.slot,
            "join reply not delivered; dropping the registration"
        );
        ctx.free_slot(a.slot);
        return;
    }
    let slot = a.slot;
    run_joined(a, &ctx, shutdown).await;
    ctx.free_slot(slot);
}

/// Checks the peer and its line, reserves a slot and creates the rings. `Err`: the reason to send.
async fn admit(conn: &mut UnixStream, uid: u32, ctx: &JoinContext) -> Result<Admitted, String> {
    let cred = conn
        .peer_cred()
        .map_err(|e| format!("reading peer credentials: {e}"))?;
    if cred.uid() != uid {
        return Err(format!(
            "peer uid {} is not the gateway's ({uid})",
            cred.uid()
        ));
    }
    let mut line = String::new();
    let mut reader = BufReader::new((&mut *conn).take(MAX_LINE as u64));
    match tokio::time::timeout(LINE_TIMEOUT, reader.read_line(&mut line)).await {
        Err(_) => return Err("no join line within the timeout".into()),
        Ok(Err(e)) => return Err(format!("reading the join line: {e}")),
        Ok(Ok(_)) if !line.ends_with('\n') => return Err("join line too long or cut".into()),
        Ok(Ok(_)) => {}
    }
    let req = JoinRequest::parse(&line).map_err(|e| e.to_string())?;
    let peer_pid = cred.pid().and_then(|p| u32::try_from(p).ok());
    if peer_pid != Some(req.pid) {
        return Err(format!(
            "claimed pid {} but the socket's peer is {peer_pid:?}",
            req.pid
        ));
    }
    // Relaxed: a plain flag.
    if ctx.shared.draining.load(Ordering::Relaxed) {
        return Err("the gateway is shutting down".into());
    }
    let slot = ctx
        .reserve_slot()
        .ok_or_else(|| format!("already {MAX_JOINED} joined workers"))?;
    let serial = ctx.serial.fetch_add(1, Ordering::Relaxed);
    let prefix = format!("{}-j{slot}s{serial}", ctx.ring_prefix);
    let made = (|| -> Result<_, ringbuf::Error> {
        let req = ringbuf::create(&format!("{prefix}-req"), ctx.ring_capacity)?;
        let resp = ringbuf::create(&format!("{prefix}-resp"), ctx.ring_capacity)?;
        let producer = req.producer()?;
        let consumer = resp.consumer()?;
        Ok(((req, resp), producer, consumer))
    })();
    match made {
        Ok((rings, producer, consumer)) => Ok(Admitted {
            slot,
            pid: req.pid,
            prefix,
            rings,
            producer,
            consumer,
        }),
        Err(e) => {
            ctx.free_slot(slot);
            tracing::error!(error = %e, "creating a joined worker's rings");
            Err("the gateway could not create the rings".into())
        }
    }
}

/// Serves one joined worker from its Hello until it leaves or the gateway stops.
async fn run_joined(a: Admitted, ctx: &JoinContext, mut shutdown: watch::Receiver<bool>) {
    let Admitted {
        slot,
        pid,
        prefix,
        rings,
        producer,
        consumer,
    } = a;
    let mut reader = match RingReader::spawn(slot, consumer, HELLO_TIMEOUT, ctx.heartbeat_timeout) {
        Ok(r) => r,
        Err(e) => {
            tracing::error!(slot, error = %e, "starting a joined worker's reader");
            return;
        }
    };
    let hello = tokio::select! {
        h = &mut reader.hello => h,
        _ = shutdown.changed() => {
            reader.join().await;
            return;
        }
    };
    let info = match hello {
        Ok(Ok(Some(info))) if info.pid == pid => info,
        Ok(Ok(Some(info))) => {
            tracing::warn!(
                slot,
                pid,
                hello_pid = info.pid,
                "joined worker's hello names another pid; dropped"
            );
            metrics::counter!(m::JOINS_REFUSED).increment(1);
            reader.join().await;
            return;
        }
        Ok(Ok(None)) => {
            tracing::warn!(slot, pid, "joined worker sent no hello in time; dropped");
            metrics::counter!(m::JOINS_REFUSED).increment(1);
            reader.join().await;
            return;
        }
        Ok(Err(e)) => {
            tracing::warn!(slot, pid, error = %e, "joined worker's hello is bad; dropped");
            metrics::counter!(m::JOINS_REFUSED).increment(1);
            reader.join().await;
            return;
        }
        Err(_) => {
            reader.join().await;
            return;
        }
    };
    let link = WorkerLink::new(slot, info, producer);
    reader.serve(link.clone());
    let shared = &ctx.shared;
    ctx.health
        .set_worker(shared, slot, Some(link.clone()))
        .await;
    metrics::counter!(m::WORKERS_JOINED).increment(1);
    tracing::info!(worker = slot, pid, rings = %prefix, "worker joined");
    // Tests and tools read this line.
    println!("worker {slot} ready pid={pid} joined");

    let end = tokio::select! {
        end = &mut reader.end => end.ok(),
        _ = shutdown.changed() => None,
    };
    link.mark_dead();
    ctx.health.set_worker(shared, slot, None).await;
    match end {
        Some(ReaderEnd::WorkerGone) if link.is_released() => {
            metrics::counter!(m::WORKERS_DRAINED).increment(1);
            tracing::info!(worker = slot, pid, "joined worker drained and left");
        }
        Some(ReaderEnd::Hung) => tracing::warn!(
            worker = slot,
            pid,
            "joined worker is hung: dropped (not killed: its launcher owns it)"
        ),
        Some(end) => tracing::warn!(worker = slot, pid, ?end, "joined worker left"),
        None => {}
    }
    reader.join().await;
    // Dropping the link and the rings unlinks both segments.
    drop(link);
    drop(rings);
    // Tests and tools read this line: the worker is gone and so are its segments (printed before
    // the drops, a test that then listed /dev/shm could still find them: 2 runs in 15 under load).
    println!("worker {slot} left pid={pid}");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir() -> PathBuf {
        let d = std::env::temp_dir().join(ringbuf::unique_name("rs-join-test"));
        std::fs::create_dir(&d).unwrap();
        d
    }

    #[tokio::test]
    async fn binds_privately_refuses_a_live_name_and_replaces_a_stale_one() {
        let root = temp_dir();
        let dir = root.join("run");
        let a = JoinListener::bind_in(&dir, "gw").unwrap();
        let dir_mode = std::fs::metadata(&dir).unwrap().mode() & 0o777;
        assert_eq!(dir_mode, 0o700);
        let sock_mode = std::fs::metadata(a.path()).unwrap().mode() & 0o777;
        assert_eq!(sock_mode, 0o600);
        assert!(matches!(
            JoinListener::bind_in(&dir, "gw"),
            Err(JoinServerError::NameInUse { .. })
        ));
        assert!(matches!(
            JoinListener::bind_in(&dir, "../gw"),
            Err(JoinServerError::Name(_))
        ));
        // Dropped: the socket file goes.
        let path = a.path().to_owned();
        drop(a);
        assert!(!path.exists());
        // A stale socket (nobody listening) is replaced.
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        assert!(path.exists());
        let b = JoinListener::bind_in(&dir, "gw").unwrap();
        drop(b);
        // A folder with loose permissions is tightened.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let c = JoinListener::bind_in(&dir, "gw").unwrap();
        assert_eq!(std::fs::metadata(&dir).unwrap().mode() & 0o777, 0o700);
        drop(c);
        std::fs::remove_dir_all(&root).unwrap();
    }

    async fn context() -> Arc<JoinContext> {
        use crate::admission::{Admission, AdmissionLimits};
        let (reporter, _) = tonic_health::server::health_reporter();
        let shared = Arc::new(Shared::new(
            "m".into(),
            Vec::new(),
            None,
            crate::router::Router::new(1),
            Admission::new(AdmissionLimits {
                max_in_flight: 1,
                max_queued_prompt_tokens: 1,
            }),
            Duration::from_secs(1),
        ));
        Arc::new(JoinContext::new(
            shared,
            Health::new(reporter).await,
            "p".into(),
            4096,
            Duration::from_secs(1),
            1,
        ))
    }

    #[tokio::test]
    async fn a_peer_of_another_user_or_a_lying_pid_is_refused() {
        let ctx = context().await;
        let uid = current_uid().unwrap();
        let (_, stop) = watch::channel(false);
        // The socket's peer credentials name this user; a gateway of another uid refuses it
        // before reading a byte.
        let (ours, theirs) = UnixStream::pair().unwrap();
        let gateway = tokio::spawn(handle(ours, uid.wrapping_add(1), ctx.clone(), stop.clone()));
        let mut reply = String::new();
        BufReader::new(theirs).read_line(&mut reply).await.unwrap();
        gateway.await.unwrap();
        assert!(reply.starts_with("error peer uid"), "{reply}");
        // Same user, but the line claims another process.
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        let gateway = tokio::spawn(handle(ours, uid, ctx.clone(), stop));
        let line = JoinRequest::new(std::process::id() + 1).to_line();
        theirs.write_all(line.as_bytes()).await.unwrap();
        let mut reply = String::new();
        BufReader::new(theirs).read_line(&mut reply).await.unwrap();
        gateway.await.unwrap();
        assert!(reply.starts_with("error claimed pid"), "{reply}");
        assert!(
            ctx.used.lock().unwrap().is_empty(),
            "a refused peer holds no slot"
        );
    }
}
