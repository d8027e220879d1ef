//! `resolve` against a local server that answers like the Hub — repository info, `resolve` URLs
//! with ETags and commit headers, LFS files redirected to a CDN host with `x-linked-etag`, ranges,
//! 401 and 404 — never the network. The cache it fills is the standard one (`models--org--name/`
//! with `blobs/`, `refs/`, `snapshots/`), and offline resolution reads it back.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use hub::{HubError, HubOptions, resolve};
use sha2::{Digest, Sha256};

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";
const TOKEN: &str = "hf_good";

/// One repository: its files and whether it needs the token.
struct FakeRepo {
    files: Vec<(String, Vec<u8>)>,
    gated: bool,
}

struct FakeHub {
    repos: HashMap<String, FakeRepo>,
    /// Serve LFS bytes that do not hash to their ETag.
    corrupt: bool,
    /// Requests for file bytes (not metadata), by path.
    downloads: Mutex<Vec<String>>,
    /// Cut the first full download of a file after this many bytes (a dropped connection).
    cut_after: Option<usize>,
    cuts: AtomicUsize,
}

fn sha256_hex(b: &[u8]) -> String {
    Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

fn is_lfs(name: &str) -> bool {
    name.ends_with(".safetensors") || name.ends_with(".gguf")
}

/// Starts the fake Hub on a free port; returns its endpoint.
fn serve(hub: Arc<FakeHub>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let base = endpoint.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            let hub = hub.clone();
            let base = base.clone();
            std::thread::spawn(move || handle(&hub, &base, stream));
        }
    });
    endpoint
}

fn handle(hub: &FakeHub, base: &str, mut stream: std::net::TcpStream) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() {
        return;
    }
    let path = line.split_whitespace().nth(1).unwrap_or("/").to_owned();
    let mut headers = HashMap::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).is_err() || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_owned());
        }
    }
    let authorized =
        headers.get("authorization").map(String::as_str) == Some(&format!("Bearer {TOKEN}"));
    let reply = |stream: &mut std::net::TcpStream,
                 status: &str,
                 extra: &[(String, String)],
                 body: &[u8]| {
        let mut head = format!(
            "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n",
            body.len()
        );
        for (k, v) in extra {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        let _ = stream.write_all(head.as_bytes());
        let _ = stream.write_all(body);
    };
    let range = |len: usize| -> (usize, usize) {
        let spec = headers.get("range").and_then(|r| r.strip_prefix("bytes="));
        match spec.and_then(|s| s.split_once('-')) {
            Some((a, b)) => {
                let a: usize = a.parse().unwrap_or(0);
                let b: usize = if b.is_empty() {
                    len.saturating_sub(1)
                } else {
                    b.parse().unwrap()
                };
                (a.min(len), (b + 1).min(len))
            }
            None => (0, len),
        }
    };
    let send_bytes = |stream: &mut std::net::TcpStream,
                      bytes: &[u8],
                      mut extra: Vec<(String, String)>| {
        let (a, b) = range(bytes.len());
        extra.push((
            "Content-Range".into(),
            format!("bytes {a}-{}/{}", b.saturating_sub(1), bytes.len()),
        ));
        let full = b - a > 1;
        if full {
            hub.downloads.lock().unwrap().push(path.clone());
        }
        if let Some(cut) = hub.cut_after
            && full
            && bytes.len() > cut
            && a == 0
            && hub.cuts.fetch_add(1, Ordering::SeqCst) == 0
        {
            // Promise everything, send `cut` bytes, drop the connection.
            let head = format!(
                "HTTP/1.1 206 Partial Content\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                b - a
            );
            let _ = stream.write_all(head.as_bytes());
            let _ = stream.write_all(&bytes[a..a + cut]);
            return;
        }
        reply(stream, "206 Partial Content", &extra, &bytes[a..b]);
    };

    if let Some(sha) = path.strip_prefix("/cdn/") {
        let file = hub
            .repos
            .values()
            .flat_map(|r| &r.files)
            .find(|(_, b)| sha256_hex(b) == sha);
        match file {
            Some((_, bytes)) => {
                let mut bytes = bytes.clone();
                if hub.corrupt {
                    bytes[0] ^= 1;
                }
                send_bytes(&mut stream, &bytes, vec![]);
            }
            None => reply(&mut stream, "404 Not Found", &[], b"{}"),
        }
        return;
    }
    if let Some(rest) = path.strip_prefix("/api/models/") {
        let Some((repo, _rev)) = rest.split_once("/revision/") else {
            return reply(&mut stream, "404 Not Found", &[], b"{}");
        };
        match hub.repos.get(repo) {
            Some(r) if r.gated && !authorized => reply(
                &mut stream,
                "401 Unauthorized",
                &[],
                b"{\"error\":\"gated\"}",
            ),
            Some(r) => {
                let siblings: Vec<serde_json::Value> = r
                    .files
                    .iter()
                    .map(|(n, _)| serde_json::json!({"rfilename": n}))
                    .collect();
                let body = serde_json::json!({"sha": COMMIT, "siblings": siblings}).to_string();
                reply(&mut stream, "200 OK", &[], body.as_bytes());
            }
            None => reply(
                &mut stream,
                "404 Not Found",
                &[],
                b"{\"error\":\"no repo\"}",
            ),
        }
        return;
    }
    // /{org}/{name}/resolve/{rev}/{file}
    let parts: Vec<&str> = path.trim_start_matches('/').splitn(5, '/').collect();
    if parts.len() == 5 && parts[2] == "resolve" {
        let repo = format!("{}/{}", parts[0], parts[1]);
        let Some(r) = hub.repos.get(&repo) else {
            return reply(&mut stream, "404 Not Found", &[], b"{}");
        };
        if r.gated && !authorized {
            return reply(&mut stream, "401 Unauthorized", &[], b"{}");
        }
        let Some((name, bytes)) = r.files.iter().find(|(n, _)| n == parts[4]) else {
            return reply(&mut stream, "404 Not Found", &[], b"{}");
        };
        let commit = ("X-Repo-Commit".to_owned(), COMMIT.to_owned());
        if is_lfs(name) {
            let sha = sha256_hex(bytes);
            let extra = vec![
                commit,
                ("X-Linked-Etag".into(), format!("\"{sha}\"")),
                ("X-Linked-Size".into(), bytes.len().to_string()),
                ("Location".into(), format!("{base}/cdn/{sha}")),
            ];
            return reply(&mut stream, "302 Found", &extra, b"");
        }
        // Small files: a git blob id as the ETag.
        let etag = format!("\"{}\"", &sha256_hex(bytes)[..40]);
        send_bytes(&mut stream, bytes, vec![commit, ("ETag".into(), etag)]);
        return;
    }
    reply(&mut stream, "404 Not Found", &[], b"{}");
}

fn tiny_model() -> Vec<(String, Vec<u8>)> {
    let weights: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 251) as u8).collect();
    vec![
        (
            "config.json".into(),
            br#"{"architectures":["LlamaForCausalLM"]}"#.to_vec(),
        ),
        ("tokenizer.json".into(), b"{}".to_vec()),
        ("README.md".into(), b"# not fetched".to_vec()),
        ("model.safetensors".into(), weights),
    ]
}

fn hub_with(repos: Vec<(&str, FakeRepo)>, corrupt: bool, cut_after: Option<usize>) -> Arc<FakeHub> {
    Arc::new(FakeHub {
        repos: repos.into_iter().map(|(n, r)| (n.to_owned(), r)).collect(),
        corrupt,
        downloads: Mutex::new(Vec::new()),
        cut_after,
        cuts: AtomicUsize::new(0),
    })
}

fn options(endpoint: &str, cache: &std::path::Path) -> HubOptions {
    HubOptions {
        endpoint: endpoint.to_owned(),
        cache_dir: cache.to_path_buf(),
        token: None,
        offline: false,
        progress: false,
    }
}

#[test]
fn a_hub_model_lands_in_the_standard_cache_and_resolves_offline_after() {
    let hub = hub_with(
        vec![(
            "org/tiny",
            FakeRepo {
                files: tiny_model(),
                gated: false,
            },
        )],
        false,
        None,
    );
    let endpoint = serve(hub.clone());
    let cache = tempfile::tempdir().unwrap();
    let opts = options(&endpoint, cache.path());
    let dir = resolve("org/tiny", None, &opts).unwrap();
    let snapshot: PathBuf = cache
        .path()
        .join("models--org--tiny/snapshots")
        .join(COMMIT);
    assert_eq!(dir, snapshot);
    for (name, bytes) in tiny_model() {
        let path = dir.join(&name);
        if name == "README.md" {
            assert!(!path.exists(), "only model files are fetched");
            continue;
        }
        assert_eq!(std::fs::read(&path).unwrap(), bytes, "{name}");
    }
    let weights_blob = std::fs::canonicalize(dir.join("model.safetensors")).unwrap();
    assert_eq!(
        weights_blob.parent().unwrap(),
        std::fs::canonicalize(cache.path().join("models--org--tiny/blobs")).unwrap()
    );
    assert_eq!(
        std::fs::read_to_string(cache.path().join("models--org--tiny/refs/main")).unwrap(),
        COMMIT
    );
    // Again: from the cache, nothing downloaded.
    let before = hub.downloads.lock().unwrap().len();
    assert_eq!(resolve("org/tiny", None, &opts).unwrap(), dir);
    assert_eq!(hub.downloads.lock().unwrap().len(), before);
    // Offline, with the server no longer asked at all.
    let offline = HubOptions {
        endpoint: "http://127.0.0.1:9".into(),
        offline: true,
        ..opts.clone()
    };
    assert_eq!(resolve("org/tiny", None, &offline).unwrap(), dir);
    assert_eq!(
        resolve(&format!("org/tiny@{COMMIT}"), None, &offline).unwrap(),
        dir
    );
    let e = resolve("org/other", None, &offline).unwrap_err();
    assert!(matches!(e, HubError::NotCached { .. }), "{e}");
    assert!(e.to_string().contains("HF_HUB_OFFLINE"), "{e}");
    // A local path is itself.
    let p = dir.to_str().unwrap();
    assert_eq!(resolve(p, None, &offline).unwrap(), dir);
}

#[test]
fn gguf_repos_pick_a_file_by_tag_or_name() {
    let files = vec![
        ("m.Q4_K_M.gguf".to_owned(), vec![1u8; 5000]),
        ("m.Q8_0.gguf".to_owned(), vec![2u8; 7000]),
        ("README.md".to_owned(), b"hi".to_vec()),
    ];
    let hub = hub_with(
        vec![(
            "org/m-gguf",
            FakeRepo {
                files,
                gated: false,
            },
        )],
        false,
        None,
    );
    let endpoint = serve(hub);
    let cache = tempfile::tempdir().unwrap();
    let opts = options(&endpoint, cache.path());
    let p = resolve("org/m-gguf:Q8_0", None, &opts).unwrap();
    assert_eq!(p.file_name().unwrap(), "m.Q8_0.gguf");
    assert_eq!(std::fs::read(&p).unwrap(), vec![2u8; 7000]);
    let p = resolve("org/m-gguf", Some("m.Q4_K_M.gguf"), &opts).unwrap();
    assert_eq!(std::fs::read(&p).unwrap(), vec![1u8; 5000]);
    let e = resolve("org/m-gguf", None, &opts).unwrap_err();
    assert!(
        e.to_string().contains("m.Q8_0.gguf") && e.to_string().contains("several"),
        "{e}"
    );
    let offline = HubOptions {
        offline: true,
        ..opts
    };
    let p = resolve("org/m-gguf:q4_k_m", None, &offline).unwrap();
    assert_eq!(p.file_name().unwrap(), "m.Q4_K_M.gguf");
}

#[test]
fn tokens_401_404_and_bad_checksums_are_typed_errors() {
    let hub = hub_with(
        vec![(
            "org/gated",
            FakeRepo {
                files: tiny_model(),
                gated: true,
            },
        )],
        false,
        None,
    );
    let endpoint = serve(hub);
    let cache = tempfile::tempdir().unwrap();
    let opts = options(&endpoint, cache.path());
    let e = resolve("org/gated", None, &opts).unwrap_err();
    assert!(
        matches!(e, HubError::Unauthorized { status: 401, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("HF_TOKEN"), "{e}");
    let with_token = HubOptions {
        token: Some(TOKEN.into()),
        ..opts.clone()
    };
    assert!(
        resolve("org/gated", None, &with_token)
            .unwrap()
            .join("config.json")
            .is_file()
    );
    let e = resolve("org/nothing", None, &opts).unwrap_err();
    assert!(matches!(e, HubError::NotFound { .. }), "{e}");
    let e = resolve("not a model", None, &opts).unwrap_err();
    assert!(matches!(e, HubError::NotAModel(_)), "{e}");

    let corrupt = hub_with(
        vec![(
            "org/tiny",
            FakeRepo {
                files: tiny_model(),
                gated: false,
            },
        )],
        true,
        None,
    );
    let endpoint = serve(corrupt);
    let cache = tempfile::tempdir().unwrap();
    let e = resolve("org/tiny", None, &options(&endpoint, cache.path())).unwrap_err();
    assert!(
        matches!(&e, HubError::Checksum { file, .. } if file == "model.safetensors"),
        "{e}"
    );
}

#[test]
fn a_dropped_download_resumes_where_it_stopped() {
    let hub = hub_with(
        vec![(
            "org/tiny",
            FakeRepo {
                files: tiny_model(),
                gated: false,
            },
        )],
        false,
        Some(50_000),
    );
    let endpoint = serve(hub.clone());
    let cache = tempfile::tempdir().unwrap();
    let dir = resolve("org/tiny", None, &options(&endpoint, cache.path())).unwrap();
    let weights = &tiny_model()[3].1;
    assert_eq!(
        &std::fs::read(dir.join("model.safetensors")).unwrap(),
        weights
    );
    assert!(
        hub.cuts.load(Ordering::SeqCst) >= 1,
        "the first download was cut"
    );
}
