//! The soak test (not in CI; `scripts/soak.sh` runs it): a `ringserve serve` under mixed valid and
//! invalid requests, cancels and deadlines for a bounded time while its workers are SIGKILLed and
//! SIGSTOPped at random; then it checks that
//! - every valid stream completed and is token-exact against a reference run made before the chaos
//!   (greedy and seeded sampling), and every invalid request got INVALID_ARGUMENT;
//! - the gateway's heap (RssAnon) and open file descriptors stay near their values after the
//!   reference run, and its resident ring pages (RssShmem) within the rings' capacity;
//! - after SIGTERM the server exits 0 and `/dev/shm` holds none of its segments.
//!
//! ```text
//! cargo run --release --example soak -- [--seconds 600] [--clients 8] [--workers 2] [--device cpu]
//!     [--chaos true|false]
//! ```

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use protos::v1::inference_client::InferenceClient;
use protos::v1::{GenerateRequest, SamplingParams, TokenIds, generate_request};
use tonic::Code;
use tonic::transport::Channel;

type Error = Box<dyn std::error::Error + Send + Sync>;

struct Options {
    seconds: u64,
    clients: usize,
    workers: usize,
    device: String,
    max_tokens: u32,
    prompts: usize,
    /// Signal workers (off: load alone, to tell what the chaos costs).
    chaos: bool,
}

fn options() -> Result<Options, Error> {
    let mut o = Options {
        seconds: 600,
        clients: 8,
        workers: 2,
        device: "cpu".into(),
        max_tokens: 24,
        prompts: 16,
        chaos: true,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    for pair in args.chunks(2) {
        let value = pair.get(1).ok_or("every flag takes a value")?;
        match pair[0].as_str() {
            "--seconds" => o.seconds = value.parse()?,
            "--clients" => o.clients = value.parse()?,
            "--workers" => o.workers = value.parse()?,
            "--device" => o.device = value.clone(),
            "--max-tokens" => o.max_tokens = value.parse()?,
            "--prompts" => o.prompts = value.parse()?,
            "--chaos" => o.chaos = value.parse()?,
            flag => return Err(format!("unknown flag {flag}").into()),
        }
    }
    Ok(o)
}

/// The server under test.
struct Served {
    child: Child,
    url: String,
    rings: String,
}

fn start(o: &Options) -> Result<Served, Error> {
    let exe = std::env::var("RINGSERVE_BIN").unwrap_or_else(|_| "target/release/ringserve".into());
    let mut child = Command::new(exe)
        .args([
            "serve",
            "--addr",
            "127.0.0.1:0",
            "--metrics-addr",
            "127.0.0.1:0",
        ])
        .args(["--workers", &o.workers.to_string(), "--device", &o.device])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let (mut url, mut rings) = (String::new(), String::new());
    let mut ready = 0;
    while ready < o.workers {
        let line = lines.next().ok_or("serve exited before it was ready")??;
        for field in line.split_whitespace() {
            if let Some(a) = field.strip_prefix("grpc=") {
                url = format!("http://{a}");
            } else if let Some(r) = field.strip_prefix("rings=") {
                rings = r.to_owned();
            }
        }
        ready += usize::from(line.starts_with("worker ") && line.contains(" ready pid="));
    }
    // Keep reading stdout so the server never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    Ok(Served { child, url, rings })
}

/// What one request asks, and how its answer is checked.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
struct Case {
    prompt: usize,
    /// Seeded sampling instead of greedy.
    seeded: bool,
}

fn request(case: Case, o: &Options) -> GenerateRequest {
    let ids = (0..8 + case.prompt as u32 % 5)
        .map(|i| 1 + (case.prompt as u32 * 37 + i * 11) % 200)
        .collect();
    GenerateRequest {
        prompt: Some(generate_request::Prompt::TokenIds(TokenIds { ids })),
        sampling: Some(SamplingParams {
            temperature: Some(if case.seeded { 0.9 } else { 0.0 }),
            top_p: Some(if case.seeded { 0.95 } else { 1.0 }),
            seed: case.seeded.then_some(1000 + case.prompt as u64),
            ..Default::default()
        }),
        max_tokens: Some(o.max_tokens),
        ignore_eos: true,
        ..Default::default()
    }
}

/// Invalid requests, each with the field its error must name.
fn invalid(i: u64) -> (GenerateRequest, &'static str) {
    let mut r = GenerateRequest {
        prompt: Some(generate_request::Prompt::TokenIds(TokenIds {
            ids: vec![1, 2],
        })),
        ..Default::default()
    };
    let field = match i % 5 {
        0 => {
            r.request_id = "x".repeat(200);
            "request_id"
        }
        1 => {
            r.stop = vec!["s".into(); 100];
            "stop"
        }
        2 => {
            r.sampling = Some(SamplingParams {
                top_p: Some(f32::NAN),
                ..Default::default()
            });
            "sampling.top_p"
        }
        3 => {
            r.prompt = Some(generate_request::Prompt::TokenIds(TokenIds {
                ids: vec![u32::MAX],
            }));
            "prompt.token_ids[0]"
        }
        _ => {
            r.max_tokens = Some(0);
            "max_tokens"
        }
    };
    (r, field)
}

async fn run(
    client: &mut InferenceClient<Channel>,
    req: GenerateRequest,
) -> Result<Vec<u32>, tonic::Status> {
    let mut stream = client.generate(req).await?.into_inner();
    let mut ids = Vec::new();
    while let Some(m) = stream.message().await? {
        ids.extend(m.token_ids);
    }
    Ok(ids)
}

#[derive(Default)]
struct Tally {
    exact: AtomicU64,
    wrong: AtomicU64,
    failed: AtomicU64,
    invalid_ok: AtomicU64,
    invalid_bad: AtomicU64,
    cancelled: AtomicU64,
    deadline: AtomicU64,
}

fn count(c: &AtomicU64) {
    // Relaxed: counters read after every task has ended.
    c.fetch_add(1, Ordering::Relaxed);
}

async fn client_loop(
    url: String,
    o: Arc<Options>,
    reference: Arc<HashMap<Case, Vec<u32>>>,
    tally: Arc<Tally>,
    until: Instant,
    me: u64,
) -> Result<(), Error> {
    let mut client = InferenceClient::connect(url).await?;
    let mut i = me;
    while Instant::now() < until {
        i = i
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let case = Case {
            prompt: (i >> 33) as usize % o.prompts,
            seeded: (i >> 20) & 1 == 1,
        };
        match (i >> 40) % 10 {
            0 | 1 => {
                let (req, field) = invalid(i >> 13);
                match run(&mut client, req).await {
                    Err(s)
                        if s.code() == Code::InvalidArgument && s.message().starts_with(field) =>
                    {
                        count(&tally.invalid_ok)
                    }
                    other => {
                        eprintln!("invalid request ({field}) answered {other:?}");
                        count(&tally.invalid_bad)
                    }
                }
            }
            2 => {
                // Cancel: read a message or two, then hang up.
                if let Ok(resp) = client.generate(request(case, &o)).await {
                    let mut stream = resp.into_inner();
                    let _ = stream.message().await;
                }
                count(&tally.cancelled);
            }
            3 => {
                let mut req = tonic::Request::new(request(case, &o));
                req.set_timeout(Duration::from_millis(1 + (i >> 50) % 200));
                let got = async {
                    let mut stream = client.generate(req).await?.into_inner();
                    let mut ids = Vec::new();
                    while let Some(m) = stream.message().await? {
                        ids.extend(m.token_ids);
                    }
                    Ok::<_, tonic::Status>(ids)
                }
                .await;
                match got {
                    Ok(ids) if ids == reference[&case] => count(&tally.exact),
                    Err(s) if s.code() == Code::DeadlineExceeded || s.code() == Code::Cancelled => {
                        count(&tally.deadline)
                    }
                    other => {
                        eprintln!("deadline request {case:?}: {other:?}");
                        count(&tally.wrong)
                    }
                }
            }
            _ => match run(&mut client, request(case, &o)).await {
                Ok(ids) if ids == reference[&case] => count(&tally.exact),
                Ok(ids) => {
                    eprintln!("{case:?}: got {ids:?}, expected {:?}", reference[&case]);
                    count(&tally.wrong)
                }
                Err(s) => {
                    eprintln!("{case:?}: {s:?}");
                    count(&tally.failed)
                }
            },
        }
    }
    Ok(())
}

/// The processes whose parent is `pid` (from each `/proc/N/stat`, whose fourth field is the
/// parent's pid; the command name before it may hold spaces, so fields are read after its ')').
fn children(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&child| {
            std::fs::read_to_string(format!("/proc/{child}/stat")).is_ok_and(|stat| {
                let after = stat.rfind(')').map_or("", |i| &stat[i + 1..]);
                after.split_whitespace().nth(1) == Some(&pid.to_string())
            })
        })
        .collect()
}

/// `kill -SIG pid`; a process that is gone already (a stopped worker the gateway replaced) is
/// not an error.
fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .stderr(Stdio::null())
        .status();
}

/// What a process holds: its private resident memory (`RssAnon`, the heap), its resident shared
/// memory (`RssShmem`: the pages of the rings it has touched, at most their capacity), in KiB,
/// and its open descriptors.
#[derive(Clone, Copy, Debug)]
struct Footprint {
    anon: u64,
    shmem: u64,
    fds: usize,
}

fn footprint(pid: u32) -> Footprint {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    Footprint {
        anon: field("RssAnon:"),
        shmem: field("RssShmem:"),
        fds: std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count()),
    }
}

/// SIGKILLs or SIGSTOPs (for 0.5–3 s) a random worker every 3–8 s until `until`.
async fn chaos(gateway: u32, until: Instant) -> (u64, u64) {
    let (mut kills, mut stops) = (0, 0);
    let mut x = u64::from(gateway) | 1;
    while Instant::now() < until {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        tokio::time::sleep(Duration::from_millis(3000 + x % 5000)).await;
        let workers = children(gateway);
        let Some(&victim) = workers.get((x >> 8) as usize % workers.len().max(1)) else {
            continue;
        };
        if x & 1 == 0 {
            signal(victim, "KILL");
            kills += 1;
        } else {
            signal(victim, "STOP");
            tokio::time::sleep(Duration::from_millis(500 + (x >> 20) % 2500)).await;
            signal(victim, "CONT");
            stops += 1;
        }
    }
    (kills, stops)
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let o = Arc::new(options()?);
    let mut served = start(&o)?;
    let gateway = served.child.id();
    println!(
        "soak: serve pid {gateway}, {} workers on {}, {} clients, {} s",
        o.workers, o.device, o.clients, o.seconds
    );

    // The reference run, before any chaos, one request at a time.
    let mut client = InferenceClient::connect(served.url.clone()).await?;
    let mut reference = HashMap::new();
    for prompt in 0..o.prompts {
        for seeded in [false, true] {
            let case = Case { prompt, seeded };
            reference.insert(case, run(&mut client, request(case, &o)).await?);
        }
    }
    let reference = Arc::new(reference);
    let before = footprint(gateway);
    let start = Instant::now();
    let until = start + Duration::from_secs(o.seconds);
    let tally = Arc::new(Tally::default());
    let mut tasks = Vec::new();
    for me in 0..o.clients as u64 {
        tasks.push(tokio::spawn(client_loop(
            served.url.clone(),
            o.clone(),
            reference.clone(),
            tally.clone(),
            until,
            me + 1,
        )));
    }
    // The gateway's footprint once a minute, to tell a plateau from a leak.
    let sampler = tokio::spawn(async move {
        let mut samples = Vec::new();
        while Instant::now() + Duration::from_secs(60) <= until {
            tokio::time::sleep(Duration::from_secs(60)).await;
            samples.push(footprint(gateway));
        }
        samples
    });
    let (kills, stops) = if o.chaos {
        chaos(gateway, until).await
    } else {
        tokio::time::sleep_until(until.into()).await;
        (0, 0)
    };
    for t in tasks {
        t.await??;
    }
    // Let the restarted workers settle and the cancelled requests drain.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = footprint(gateway);
    let samples = sampler.await?;

    signal(gateway, "TERM");
    let status = served.child.wait()?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let left: Vec<String> = std::fs::read_dir("/dev/shm")?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&served.rings))
        .collect();

    let t = &tally;
    let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
    println!(
        "soak: {:.0} s, {kills} SIGKILLs, {stops} SIGSTOPs; streams: {} token-exact, {} wrong, {} failed; \
         invalid: {} INVALID_ARGUMENT, {} otherwise; {} cancelled, {} past their deadline",
        start.elapsed().as_secs_f64(),
        get(&t.exact),
        get(&t.wrong),
        get(&t.failed),
        get(&t.invalid_ok),
        get(&t.invalid_bad),
        get(&t.cancelled),
        get(&t.deadline),
    );
    println!(
        "soak: gateway heap (RssAnon) {} -> {} KiB, ring pages (RssShmem) {} -> {} KiB, fds {} -> {}; \
         exit {status}; segments left: {}",
        before.anon,
        after.anon,
        before.shmem,
        after.shmem,
        before.fds,
        after.fds,
        left.len()
    );
    let per_minute: Vec<String> = samples
        .iter()
        .map(|f| format!("{}/{}/{}", f.anon, f.shmem, f.fds))
        .collect();
    println!(
        "soak: gateway heap KiB / ring pages KiB / fds each minute under load: {}",
        per_minute.join(" ")
    );
    let mut failures = Vec::new();
    if get(&t.wrong) + get(&t.failed) + get(&t.invalid_bad) > 0 {
        failures.push("streams were wrong or failed");
    }
    if get(&t.exact) == 0 {
        failures.push("no stream completed");
    }
    // The heap may settle at a higher level than after the reference run (allocator caches,
    // buffers sized for the peak), but not keep growing; ring pages only grow to the rings'
    // capacity (2 rings of --ring-mib per worker, 4 MiB each by default).
    if after.anon > before.anon * 2 + 16 * 1024 {
        failures.push("the gateway's heap grew");
    }
    if after.shmem > (o.workers as u64) * 2 * 4 * 1024 + 1024 {
        failures.push("the gateway holds more ring pages than its rings have");
    }
    if after.fds > before.fds + 16 {
        failures.push("the gateway's descriptors grew");
    }
    if !status.success() {
        failures.push("serve did not exit 0 after SIGTERM");
    }
    if !left.is_empty() {
        failures.push("segments were left in /dev/shm");
    }
    if failures.is_empty() {
        println!("soak: PASS");
        Ok(())
    } else {
        Err(failures.join("; ").into())
    }
}
