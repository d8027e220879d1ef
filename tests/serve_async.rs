//! `serve --async-scheduling` end to end on the null device (which takes launched steps: the
//! engine plans each decode step ahead while the one before it is "on the device"): concurrent
//! streams of different lengths, arrivals while others decode, and a stop string's cancel all
//! give the synchronous server's tokens.

mod common;

use common::{Server, collect, greedy, ids_of, runtime, write_demo};
use protos::v1::{FinishReason, GenerateRequest, generate_request};

#[test]
fn async_scheduling_streams_the_synchronous_tokens() {
    let dir = tempfile::tempdir().unwrap();
    write_demo(dir.path());
    let model = dir.path().to_str().unwrap().to_owned();
    let log = dir.path().join("async.log");
    let sync = Server::start(&["--model", &model, "--device", "null"], 1);
    let asynch = Server::start_logged(
        &["--model", &model, "--device", "null", "--async-scheduling"],
        1,
        &[("RUST_LOG", std::path::Path::new("worker=debug"))],
        Some(&log),
    );
    let rt = runtime();
    let requests: Vec<GenerateRequest> = (0..24u32)
        .map(|i| {
            let text = format!(
                "request {i}: {}",
                "tell me more ".repeat(1 + i as usize % 5)
            );
            greedy(generate_request::Prompt::Text(text), 4 + (i * 7) % 90)
        })
        .collect();
    let outputs = |server: &Server| {
        rt.block_on(async {
            let mut tasks = Vec::new();
            for (i, req) in requests.iter().enumerate() {
                let mut client = server.client().await;
                let req = req.clone();
                tasks.push(tokio::spawn(async move {
                    // Later requests arrive while earlier ones decode.
                    tokio::time::sleep(std::time::Duration::from_millis(3 * i as u64)).await;
                    collect(&mut client, req).await.unwrap()
                }));
            }
            let mut out = Vec::new();
            for t in tasks {
                out.push(t.await.unwrap());
            }
            out
        })
    };
    let (want, got) = (outputs(&sync), outputs(&asynch));
    for (i, (w, g)) in want.iter().zip(&got).enumerate() {
        assert_eq!(ids_of(g), ids_of(w), "request {i}");
        assert_eq!(ids_of(g).len(), 4 + (i * 7) % 90);
        let text: String = g.iter().map(|m| m.text.as_str()).collect();
        let want_text: String = w.iter().map(|m| m.text.as_str()).collect();
        assert_eq!(text, want_text, "request {i}");
    }
    // A stop string from the middle of a long output: the gateway cancels the request while the
    // worker has its next step in flight.
    rt.block_on(async {
        let full: String = want[20].iter().map(|m| m.text.as_str()).collect();
        let chars: Vec<char> = full.chars().collect();
        assert!(chars.len() > 20, "{full:?}");
        let stop: String = chars[chars.len() / 2..chars.len() / 2 + 4].iter().collect();
        let req = GenerateRequest {
            stop: vec![stop.clone()],
            ..requests[20].clone()
        };
        let mut a = asynch.client().await;
        let mut s = sync.client().await;
        let got = collect(&mut a, req.clone()).await.unwrap();
        let want = collect(&mut s, req).await.unwrap();
        let text: String = got.iter().map(|m| m.text.as_str()).collect();
        assert_eq!(text, full[..full.find(&stop).unwrap()], "stop {stop:?}");
        assert_eq!(
            text,
            want.iter().map(|m| m.text.as_str()).collect::<String>()
        );
        assert_eq!(got.last().unwrap().finish_reason, FinishReason::Stop as i32);
    });
    assert!(asynch.wait_metric(
        "ringserve_num_requests_running",
        std::time::Duration::from_secs(30),
        |v| v == 0.0
    ));
    drop(asynch);
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(
        log.contains("the first step planned ahead"),
        "the async server planned steps ahead"
    );
}
