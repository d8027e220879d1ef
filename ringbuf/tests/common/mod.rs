//! Helpers shared by the multi-process tests: test records (sequence number + checksum), child
//! processes (this test binary re-executed), CPU pinning, and `/dev/shm` checks.
#![allow(dead_code)] // each test binary uses a different subset

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::Duration;

/// Environment variable naming the child's job; set only in re-executed children.
pub const CHILD_ENV: &str = "RINGBUF_TEST_CHILD";

/// A small, fast, deterministic generator (xorshift64*).
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A record length between 8 and `max` bytes, log-uniform (many small, some large).
    pub fn len(&mut self, max: usize) -> usize {
        let bits = max.ilog2() - 3; // 8 = 2^3
        let exp = 3 + (self.next() % u64::from(bits + 1)) as u32;
        let hi = (1usize << exp).min(max);
        let lo = (hi / 2).max(8);
        lo + (self.next() as usize) % (hi - lo + 1)
    }
}

/// Filler bytes records are cut from (the same in every process).
pub fn pool() -> Vec<u8> {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    (0..8192 + 64).map(|_| rng.next() as u8).collect()
}

fn checksum(seq: u32, body: &[u8]) -> u32 {
    let mut h = u64::from(seq) ^ ((body.len() as u64) << 32);
    let mut chunks = body.chunks_exact(8);
    for c in &mut chunks {
        h = h.rotate_left(5) ^ u64::from_le_bytes(c.try_into().unwrap());
        h = h.wrapping_mul(0x100_0000_01B3);
    }
    for &b in chunks.remainder() {
        h = (h.rotate_left(5) ^ u64::from(b)).wrapping_mul(0x100_0000_01B3);
    }
    (h ^ (h >> 32)) as u32
}

/// Writes record `seq` into `buf` (at least 8 bytes): `[seq u32][checksum u32][filler]`.
pub fn fill(pool: &[u8], seq: u32, buf: &mut [u8]) {
    let body_len = buf.len() - 8;
    let start = (seq as usize).wrapping_mul(7919) % 4096;
    buf[8..].copy_from_slice(&pool[start..start + body_len]);
    let sum = checksum(seq, &buf[8..]);
    buf[..4].copy_from_slice(&seq.to_le_bytes());
    buf[4..8].copy_from_slice(&sum.to_le_bytes());
}

/// Checks that `rec` is record `seq`, complete and intact.
pub fn verify(seq: u32, rec: &[u8]) -> Result<(), String> {
    if rec.len() < 8 {
        return Err(format!(
            "record {seq}: {} bytes, shorter than its header",
            rec.len()
        ));
    }
    let got = u32::from_le_bytes(rec[..4].try_into().unwrap());
    if got != seq {
        return Err(format!("expected record {seq}, got {got}"));
    }
    let sum = u32::from_le_bytes(rec[4..8].try_into().unwrap());
    if sum != checksum(seq, &rec[8..]) {
        return Err(format!(
            "record {seq} ({} bytes): checksum mismatch",
            rec.len()
        ));
    }
    Ok(())
}

/// A re-executed copy of this test binary running the `child` test with `vars` in its environment.
pub struct ChildProc {
    pub child: Child,
    lines: BufReader<ChildStdout>,
}

impl ChildProc {
    pub fn spawn(job: &str, vars: &[(&str, String)]) -> ChildProc {
        let exe = std::env::current_exe().expect("test binary path");
        let mut cmd = Command::new(exe);
        cmd.args([
            "child",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, job)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
        for (k, v) in vars {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn child test process");
        let lines = BufReader::new(child.stdout.take().expect("child stdout"));
        ChildProc { child, lines }
    }

    /// The next `@@`-prefixed protocol line from the child (libtest's own output is skipped).
    pub fn expect_line(&mut self) -> String {
        let mut line = String::new();
        loop {
            line.clear();
            let n = self.lines.read_line(&mut line).expect("read child stdout");
            assert!(
                n > 0,
                "child exited early (status {:?})",
                self.child.try_wait()
            );
            // libtest may print "test child ... " without a newline just before our line.
            if let Some(at) = line.find("@@") {
                return line[at + 2..].trim_end().to_owned();
            }
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// SIGKILLs the child and reaps it.
    pub fn kill(mut self) {
        // SAFETY: plain kill(2) on our own child's pid, which is not yet reaped (so not reused).
        unsafe { libc::kill(self.pid(), libc::SIGKILL) };
        self.child.wait().expect("reap killed child");
    }

    /// Waits for the child to exit and asserts it succeeded.
    pub fn finish(mut self) {
        let status = self.child.wait().expect("wait for child");
        assert!(status.success(), "child failed: {status}");
    }
}

/// Prints a protocol line for the parent.
pub fn say(line: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    writeln!(out, "@@{line}").unwrap();
    out.flush().unwrap();
}

pub fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("child needs ${name}"))
}

pub fn env_u64(name: &str) -> u64 {
    env(name)
        .parse()
        .unwrap_or_else(|_| panic!("${name} is not a number"))
}

/// Pins the calling thread (and children it spawns afterwards) to CPU 0.
pub fn pin_to_cpu0() {
    // SAFETY: `set` is a valid cpu_set_t, zeroed then given one CPU; pid 0 is the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(0, &mut set);
        assert_eq!(
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set),
            0
        );
    }
}

/// Number of CPUs the calling thread may run on.
pub fn allowed_cpus() -> usize {
    // SAFETY: `set` is a valid, writable cpu_set_t; pid 0 is the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        assert_eq!(
            libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set),
            0
        );
        libc::CPU_COUNT(&set) as usize
    }
}

/// A segment name unique to this test.
pub fn name(test: &str) -> String {
    ringbuf::unique_name(&format!("ringbuf-test-{test}"))
}

/// Asserts that `/dev/shm` holds no segment whose name starts with `prefix`.
pub fn assert_shm_clean(prefix: &str) {
    let left: Vec<_> = std::fs::read_dir("/dev/shm")
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(prefix))
        .collect();
    assert!(left.is_empty(), "segments left in /dev/shm: {left:?}");
}

/// Generous per-wait timeout for tests: only a hang ever reaches it.
pub const PATIENCE: Duration = Duration::from_secs(30);
