//! `--model org/name` through the CLI, offline: a HuggingFace cache laid out by hand (what
//! huggingface_hub, transformers and vLLM write) is found with `HF_HUB_OFFLINE=1`, and a name the
//! cache lacks is a clear error naming it. Fetching from a Hub-like server is tested in
//! `hub/tests/hub.rs`.

mod common;

use std::path::Path;
use std::process::Command;

use common::tiny_llama;

const COMMIT: &str = "89abcdef0123456789abcdef0123456789abcdef";

/// `cache/models--org--tiny/{refs/main, snapshots/COMMIT/*}` holding the tiny-llama fixture.
fn fake_cache(cache: &Path) {
    let root = cache.join("models--org--tiny");
    std::fs::create_dir_all(root.join("refs")).unwrap();
    std::fs::write(root.join("refs/main"), COMMIT).unwrap();
    let snap = root.join("snapshots").join(COMMIT);
    std::fs::create_dir_all(&snap).unwrap();
    for entry in std::fs::read_dir(tiny_llama()).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_file() {
            std::fs::copy(entry.path(), snap.join(entry.file_name())).unwrap();
        }
    }
}

fn generate(model: &str, cache: &Path, dir: &Path) -> std::process::Output {
    let input = dir.join("in.jsonl");
    std::fs::write(
        &input,
        "{\"prompt_token_ids\": [1, 2, 3], \"max_tokens\": 4, \"temperature\": 0}\n",
    )
    .unwrap();
    Command::new(env!("CARGO_BIN_EXE_ringserve"))
        .args(["generate", "--model", model, "--device", "cpu", "--quiet"])
        .arg("--input")
        .arg(&input)
        .arg("--output")
        .arg(dir.join("out.jsonl"))
        .env("HF_HUB_OFFLINE", "1")
        .env("HF_HUB_CACHE", cache)
        .env_remove("HF_HOME")
        .output()
        .unwrap()
}

#[test]
fn a_hub_name_resolves_from_the_cache_offline() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("hub");
    fake_cache(&cache);
    let out = generate("org/tiny", &cache, tmp.path());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let result = std::fs::read_to_string(tmp.path().join("out.jsonl")).unwrap();
    let v: serde_json::Value = serde_json::from_str(result.lines().next().unwrap()).unwrap();
    assert_eq!(v["token_ids"].as_array().unwrap().len(), 4);
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(
        log.contains("model resolved") && log.contains(COMMIT),
        "{log}"
    );

    // By commit too; a missing revision or repository names what the cache lacks.
    assert!(
        generate(&format!("org/tiny@{COMMIT}"), &cache, tmp.path())
            .status
            .success()
    );
    for (model, what) in [
        ("org/tiny@v2", "revision \"v2\""),
        ("org/absent", "org/absent"),
    ] {
        let out = generate(model, &cache, tmp.path());
        assert!(!out.status.success(), "{model}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("HF_HUB_OFFLINE") && err.contains(what),
            "{model}: {err}"
        );
    }
    let out = generate("no/such/thing here", &cache, tmp.path());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("neither a local folder"), "{err}");
}
