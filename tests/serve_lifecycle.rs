//! End to end, the life of requests and processes: cancellation frees KV blocks, overload is refused
//! while admitted requests finish, SIGTERM drains and cleans up, a killed worker is restarted.
//!
//! These run the `null` device (no math, deterministic tokens) over the tiny-llama config with a
//! large context, so a request can be long. A stream the client does not read stays in flight: the
//! gateway holds its tokens (bounded by the request's budget) until the client reads them.

mod common;

use std::time::Duration;

use common::{Server, collect, greedy_ids, ids_of, runtime, signal, tiny_llama};
use protos::v1::FinishReason;
use tonic::Code;

const LONG: u32 = 190_000;

fn null_server(extra: &[&str]) -> Server {
    let model = tiny_llama().to_str().unwrap().to_owned();
    let mut args = vec![
        "--model",
        model.as_str(),
        "--device",
        "null",
        "--max-model-len",
        "200000",
        "--num-kv-blocks",
        "20000",
    ];
    args.extend_from_slice(extra);
    Server::start(&args, 1)
}

#[test]
fn cancel_mid_stream_frees_kv_blocks_and_running_sequences() {
    let server = null_server(&[]);
    let rt = runtime();
    rt.block_on(async {
        let mut client = server.client().await;
        let mut stream = client
            .generate(greedy_ids(
                &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17],
                LONG,
            ))
            .await
            .unwrap()
            .into_inner();
        let first = stream.message().await.unwrap().unwrap();
        assert!(!first.token_ids.is_empty());
        drop(stream);
    });
    // Generous deadlines: the point is that they return to 0, not how fast.
    assert!(
        server.wait_metric(
            "ringserve_requests_total{outcome=\"cancelled\"}",
            Duration::from_secs(30),
            |v| v == 1.0
        ),
        "the request was cancelled, not finished: {}",
        server.metrics()
    );
    assert!(
        server.wait_metric("ringserve_kv_blocks_used", Duration::from_secs(30), |v| v
            == 0.0),
        "KV blocks back to 0: {}",
        server.metrics()
    );
    assert!(server.wait_metric(
        "ringserve_num_requests_running",
        Duration::from_secs(30),
        |v| v == 0.0
    ));
    let generated = server
        .metric("ringserve_generation_tokens_total")
        .unwrap_or(0.0);
    assert!(generated < f64::from(LONG), "generated {generated}");
}

#[test]
fn overload_is_resource_exhausted_while_admitted_requests_complete() {
    let server = null_server(&["--max-in-flight", "2"]);
    let rt = runtime();
    rt.block_on(async {
        let mut client = server.client().await;
        // Two admitted streams, not read yet: they stay in flight. HTTP/2 lets a server write a few MB
        // ahead of a client that does not read, and a request whose stream went to the transport
        // is no longer held; 20 logprobs per token make each stream ~12 MB, far past that.
        const ADMITTED_TOKENS: u32 = 60_000;
        let mut admitted = Vec::new();
        for _ in 0..2 {
            let mut request = greedy_ids(&[1, 2, 3], ADMITTED_TOKENS);
            request.logprobs = 20;
            let s = client.generate(request).await.unwrap().into_inner();
            admitted.push(s);
        }
        for _ in 0..3 {
            let err = collect(&mut client, greedy_ids(&[4, 5], 10))
                .await
                .unwrap_err();
            assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
            assert!(err.message().contains("in flight"), "{}", err.message());
        }
        for mut s in admitted {
            let mut n = 0;
            let mut last = None;
            while let Some(m) = s.message().await.unwrap() {
                assert!(m.token_ids.len() <= gateway::stream::MAX_TOKENS_PER_MESSAGE);
                n += m.token_ids.len();
                last = Some(m.finish_reason);
            }
            assert_eq!(n, ADMITTED_TOKENS as usize);
            assert_eq!(last, Some(FinishReason::Length as i32));
        }
        // Capacity is back.
        assert_eq!(
            ids_of(&collect(&mut client, greedy_ids(&[4, 5], 10)).await.unwrap()).len(),
            10
        );
    });
}

#[test]
fn sigterm_drains_in_flight_streams_and_leaves_no_segments() {
    use tonic_health::pb::health_check_response::ServingStatus;

    let mut server = null_server(&["--drain-timeout", "60"]);
    assert_eq!(
        server.leftover_segments().len(),
        2,
        "one request and one response ring"
    );
    let rt = runtime();
    rt.block_on(async {
        let mut client = server.client().await;
        let mut stream = client
            .generate(greedy_ids(&[1, 2, 3], 30_000))
            .await
            .unwrap()
            .into_inner();
        let first = stream.message().await.unwrap().unwrap();
        let mut n = first.token_ids.len();
        server.sigterm();
        // Draining: health says NOT_SERVING and new requests are refused.
        common::wait_health(&server, ServingStatus::NotServing, Duration::from_secs(5)).await;
        let err = collect(&mut client, greedy_ids(&[1], 2)).await.unwrap_err();
        assert_eq!(err.code(), Code::Unavailable);
        // The in-flight stream finishes whole.
        let mut last = None;
        while let Some(m) = stream.message().await.unwrap() {
            n += m.token_ids.len();
            last = Some(m.finish_reason);
        }
        assert_eq!(n, 30_000);
        assert_eq!(last, Some(FinishReason::Length as i32));
    });
    let status = server
        .wait_exit(Duration::from_secs(60))
        .expect("serve exited");
    assert!(status.success(), "{status:?}");
    assert_eq!(server.leftover_segments(), Vec::<String>::new());
}

#[test]
fn a_killed_worker_is_restarted_and_with_no_live_worker_its_requests_end_unavailable() {
    // With one worker and no failover wait, a request cut by its worker's death has nowhere to go.
    let mut server = null_server(&["--failover-timeout", "0"]);
    let old_pid = server.worker_pids[0];
    let rt = runtime();
    rt.block_on(async {
        let mut client = server.client().await;
        let mut stream = client
            .generate(greedy_ids(&[1, 2, 3], LONG))
            .await
            .unwrap()
            .into_inner();
        stream.message().await.unwrap().unwrap();
        signal(old_pid, "KILL");
        // The stream ends with UNAVAILABLE (after whatever tokens had arrived), never hangs.
        // (With a live worker, or one ready within the timeout, it resumes instead: serve_failover.)
        let end = tokio::time::timeout(Duration::from_secs(60), async {
            loop {
                match stream.message().await {
                    Ok(Some(_)) => {}
                    Ok(None) => return Ok(()),
                    Err(e) => return Err(e),
                }
            }
        })
        .await
        .expect("the stream ended");
        let err = end.expect_err("a stream cut by a dead worker is an error");
        assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    });
    let (slot, new_pid) = server.wait_worker_ready(Duration::from_secs(60));
    assert_eq!(slot, 0);
    assert_ne!(new_pid, old_pid);
    rt.block_on(async {
        let mut client = server.client().await;
        let msgs = collect(&mut client, greedy_ids(&[1, 2, 3], 16))
            .await
            .unwrap();
        assert_eq!(ids_of(&msgs).len(), 16);
    });
    assert!(
        server
            .metric("ringserve_worker_restarts_total")
            .unwrap_or(0.0)
            >= 1.0
    );
}

#[test]
fn an_expired_deadline_ends_the_stream_and_frees_the_request() {
    let server = null_server(&[]);
    let rt = runtime();
    rt.block_on(async {
        let mut client = server.client().await;
        let mut req = tonic::Request::new(greedy_ids(&[1, 2, 3], LONG));
        req.set_timeout(Duration::from_millis(100));
        let mut stream = client.generate(req).await.unwrap().into_inner();
        // Read slowly: the deadline passes while the request is still streaming.
        let err = loop {
            match stream.message().await {
                Ok(Some(_)) => tokio::time::sleep(Duration::from_millis(20)).await,
                Ok(None) => panic!("the stream finished before its deadline"),
                Err(e) => break e,
            }
        };
        assert!(
            matches!(err.code(), Code::DeadlineExceeded | Code::Cancelled),
            "{err:?}"
        );
    });
    assert!(server.wait_metric(
        "ringserve_requests_total{outcome=\"deadline_exceeded\"}",
        Duration::from_secs(30),
        |v| v == 1.0
    ));
    assert!(
        server.wait_metric("ringserve_kv_blocks_used", Duration::from_secs(30), |v| v
            == 0.0)
    );
}
