//! The official `openai` Python package against `ringserve serve` (tests/openai_sdk/): streaming
//! and non-streaming chat and completions, `n`, `seed`, `stop`, `logprobs`, 404/400/401/429 and
//! the SSE framing on the wire.
//!
//! Needs Python 3 with `openai` importable, from `RINGSERVE_OPENAI_PYTHONPATH` (a `pip install
//! --target` folder; `.ci/run` makes one) or the interpreter's own packages. Without it the test
//! says it skipped, unless `RINGSERVE_REQUIRE_OPENAI=1` (set in CI), which makes it fail.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::Server;

fn python() -> Command {
    let mut cmd = Command::new("python3");
    if let Some(path) = std::env::var_os("RINGSERVE_OPENAI_PYTHONPATH") {
        cmd.env("PYTHONPATH", path);
    }
    cmd
}

fn openai_available() -> bool {
    python()
        .args(["-c", "import openai"])
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn the_openai_python_sdk_talks_to_the_server() {
    if !openai_available() {
        assert!(
            std::env::var("RINGSERVE_REQUIRE_OPENAI").as_deref() != Ok("1"),
            "RINGSERVE_REQUIRE_OPENAI=1 but `import openai` fails (RINGSERVE_OPENAI_PYTHONPATH={:?})",
            std::env::var_os("RINGSERVE_OPENAI_PYTHONPATH")
        );
        eprintln!(
            "SKIPPED: the `openai` Python package is not importable; set \
             RINGSERVE_OPENAI_PYTHONPATH to a `pip install --target DIR openai` folder"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    common::write_demo(dir.path());
    let model = dir.path().to_str().unwrap().to_owned();
    let server = Server::start(
        &[
            "--model",
            &model,
            "--served-model-name",
            "demo-sdk",
            "--api-key",
            "sdk-key",
            "--max-in-flight",
            "1",
        ],
        1,
    );
    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/openai_sdk/check_openai_sdk.py");
    let out = python()
        .arg(&script)
        .arg(format!("http://{}/v1", server.http_addr))
        .args(["sdk-key", "demo-sdk"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    print!("{stdout}");
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("all openai SDK checks passed"), "{stdout}");
}
