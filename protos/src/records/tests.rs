use super::*;

fn submit() -> Submit {
    Submit {
        request_id: 42,
        sampling: SamplingWire {
            temperature: 0.7,
            top_k: 5,
            seed: 9,
            ..SamplingWire::default()
        },
        max_tokens: 16,
        min_tokens: 3,
        logprobs: 2,
        ignore_eos: true,
        stop_token_ids: vec![2, 3],
        prompt: vec![1, 100, 200, 300],
        prior_output_len: 1,
        grammar: Some(GrammarWire {
            kind: 2,
            text: r#"{"type":"object","title":"é"}"#.into(),
        }),
    }
}

#[test]
fn submit_min_tokens_beyond_the_budget_and_reserved_bits_are_rejected() {
    let s = submit();
    let mut buf = vec![0u8; s.encoded_len()];
    s.encode(&mut buf).unwrap();
    assert_eq!(Submit::decode(&buf).unwrap().min_tokens, 3);
    // min_tokens lives at byte 72: max_tokens 16 + prior output 1 allow 17, not 18.
    buf[72..76].copy_from_slice(&17u32.to_ne_bytes());
    assert_eq!(Submit::decode(&buf).unwrap().min_tokens, 17);
    buf[72..76].copy_from_slice(&18u32.to_ne_bytes());
    assert!(matches!(
        Submit::decode(&buf),
        Err(WireError::Invalid {
            what: "submit min_tokens",
            value: 18
        })
    ));
    buf[72..76].copy_from_slice(&3u32.to_ne_bytes());
    buf[84..88].copy_from_slice(&1u32.to_ne_bytes());
    assert!(matches!(
        Submit::decode(&buf),
        Err(WireError::Invalid {
            what: "submit reserved",
            value: 1
        })
    ));
}

#[test]
fn submit_grammar_round_trips_and_bad_grammar_bytes_are_rejected() {
    let s = submit();
    let mut buf = vec![0u8; s.encoded_len()];
    s.encode(&mut buf).unwrap();
    assert_eq!(Submit::decode(&buf).unwrap(), s);
    let text_at = buf.len() - s.grammar.as_ref().unwrap().text.len();
    // grammar_kind at byte 76: 0 with source bytes present is a contradiction.
    let mut bad = buf.clone();
    bad[76..80].copy_from_slice(&0u32.to_ne_bytes());
    assert!(matches!(
        Submit::decode(&bad),
        Err(WireError::Invalid {
            what: "submit grammar_len without a grammar kind",
            ..
        })
    ));
    let mut bad = buf.clone();
    bad[text_at] = 0xFF;
    assert!(matches!(
        Submit::decode(&bad),
        Err(WireError::Invalid {
            what: "submit grammar (not UTF-8) at byte",
            value: 0
        })
    ));
    // grammar_len at byte 80, claiming more bytes than the record has.
    let mut bad = buf.clone();
    bad[80..84].copy_from_slice(&1000u32.to_ne_bytes());
    assert!(matches!(
        Submit::decode(&bad),
        Err(WireError::Truncated { .. })
    ));
    let mut none = submit();
    none.grammar = None;
    let mut buf = vec![0u8; none.encoded_len()];
    none.encode(&mut buf).unwrap();
    assert_eq!(Submit::decode(&buf).unwrap().grammar, None);
    none.grammar = Some(GrammarWire {
        kind: 0,
        text: String::new(),
    });
    assert!(
        none.encode(&mut buf).is_err(),
        "kind 0 is reserved for none"
    );
}

#[test]
fn submit_prior_output_longer_than_the_prompt_is_rejected() {
    let s = submit();
    let mut buf = vec![0u8; s.encoded_len()];
    s.encode(&mut buf).unwrap();
    // prior_output_len lives at byte 68.
    buf[68..72].copy_from_slice(&5u32.to_ne_bytes());
    assert!(matches!(
        Submit::decode(&buf),
        Err(WireError::Invalid {
            what: "submit prior_output_len",
            value: 5
        })
    ));
    buf[68..72].copy_from_slice(&4u32.to_ne_bytes());
    assert_eq!(Submit::decode(&buf).unwrap().prior_output_len, 4);
}

#[test]
fn submit_round_trips() {
    let s = submit();
    let mut buf = vec![0u8; s.encoded_len() + 8];
    let n = s.encode(&mut buf).unwrap();
    assert_eq!(n, s.encoded_len());
    assert_eq!(peek_kind(&buf[..n]).unwrap(), RecordKind::Submit);
    assert_eq!(Submit::decode(&buf[..n]).unwrap(), s);
    // 8-byte padding after the record is tolerated, more is not.
    assert_eq!(Submit::decode(&buf[..n.next_multiple_of(8)]).unwrap(), s);
    assert!(Submit::decode(&buf[..n + 8]).is_err());
}

#[test]
fn draining_and_release_round_trip_and_check_their_kind() {
    let mut buf = [0u8; 16];
    assert_eq!(Draining::new().encode(&mut buf).unwrap(), Draining::LEN);
    assert_eq!(peek_kind(&buf[..8]).unwrap(), RecordKind::Draining);
    Draining::decode(&buf[..8]).unwrap();
    assert!(matches!(
        Release::decode(&buf[..8]),
        Err(WireError::Kind { got: 5, .. })
    ));
    assert_eq!(Release::new().encode(&mut buf).unwrap(), Release::LEN);
    assert_eq!(peek_kind(&buf[..8]).unwrap(), RecordKind::Release);
    Release::decode(&buf[..8]).unwrap();
    assert!(Release::decode(&buf[..4]).is_err());
    assert!(Release::decode(&buf[..16]).is_err());
    // A record of the previous layout version is refused, naming it.
    buf[0..2].copy_from_slice(&2u16.to_ne_bytes());
    assert_eq!(
        Release::decode(&buf[..8]),
        Err(WireError::Version { got: 2 })
    );
    assert_eq!(peek_kind(&buf[..8]), Err(WireError::Version { got: 2 }));
}

#[test]
fn every_truncation_of_a_submit_is_an_error() {
    let s = submit();
    let mut buf = vec![0u8; s.encoded_len()];
    s.encode(&mut buf).unwrap();
    for len in 0..buf.len() {
        assert!(Submit::decode(&buf[..len]).is_err(), "len {len}");
    }
    assert_eq!(Submit::peek_request_id(&buf[..20]), Some(42));
    assert_eq!(Submit::peek_request_id(&buf[..10]), None);
}

#[test]
fn submit_with_huge_counts_is_rejected_not_allocated() {
    let s = submit();
    let mut buf = vec![0u8; s.encoded_len()];
    s.encode(&mut buf).unwrap();
    // num_prompt_tokens lives at byte 64.
    buf[64..68].copy_from_slice(&u32::MAX.to_ne_bytes());
    assert!(matches!(
        Submit::decode(&buf),
        Err(WireError::Truncated { .. })
    ));
}

#[test]
fn wrong_version_and_kind_are_typed_errors() {
    let mut buf = vec![0u8; Cancel::LEN];
    Cancel::new(7).encode(&mut buf).unwrap();
    assert_eq!(Cancel::decode(&buf).unwrap(), 7);
    assert!(matches!(
        Submit::decode(&buf),
        Err(WireError::Truncated { .. }) | Err(WireError::Kind { .. })
    ));
    buf[0] = 99;
    assert!(matches!(
        Cancel::decode(&buf),
        Err(WireError::Version { .. })
    ));
}

#[test]
fn hello_round_trips() {
    let info = HelloInfo {
        pid: 1,
        num_kv_blocks: 100,
        block_size: 16,
        max_model_len: 512,
        vocab_size: 512,
        max_num_seqs: 8,
    };
    let mut buf = [0u8; Hello::LEN];
    Hello::new(info).encode(&mut buf).unwrap();
    assert_eq!(Hello::decode(&buf).unwrap(), info);
}

fn tokens_record() -> (Vec<u8>, usize) {
    let mut buf = vec![0u8; 1024];
    let gauges = EngineGauges {
        step: 3,
        running: 2,
        waiting: 1,
        kv_blocks_used: 5,
        kv_blocks_total: 64,
        response_ring_stalls: 0,
    };
    let mut w = TokensWriter::new(&mut buf, gauges).unwrap();
    w.push(&TokenEntry {
        request_id: 1,
        tokens: &[10, 11, 12],
        logprobs: None,
        finish: Finish::None,
        error: ErrorCode::None,
        prompt_tokens: 4,
    })
    .unwrap();
    w.push(&TokenEntry {
        request_id: 2,
        tokens: &[20],
        logprobs: Some(EntryLogprobs {
            num_top: 2,
            chosen: &[-0.5],
            top: &[(20, -0.5), (21, -1.5)],
        }),
        finish: Finish::Length,
        error: ErrorCode::None,
        prompt_tokens: 7,
    })
    .unwrap();
    let n = w.finish();
    (buf, n)
}

#[test]
fn tokens_round_trip() {
    let (buf, n) = tokens_record();
    let mut seen = Vec::new();
    let g = Tokens::decode(&buf[..n], |e| {
        let lp = e
            .logprobs
            .map(|l| (l.chosen(0), l.top(0).collect::<Vec<_>>()));
        seen.push((
            e.request_id,
            e.tokens.to_vec(),
            e.finish,
            e.prompt_tokens,
            lp,
        ));
    })
    .unwrap();
    assert_eq!(g.step, 3);
    assert_eq!(g.kv_blocks_used, 5);
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].1, vec![10, 11, 12]);
    assert_eq!(seen[0].4, None);
    assert_eq!(seen[1].2, Finish::Length);
    assert_eq!(seen[1].4, Some((Some(-0.5), vec![(20, -0.5), (21, -1.5)])));
}

#[test]
fn corrupt_tokens_records_are_errors_and_deliver_nothing() {
    let (buf, n) = tokens_record();
    for len in 0..n {
        let mut calls = 0;
        let r = Tokens::decode(&buf[..len], |_| calls += 1);
        assert!(r.is_err(), "len {len}");
        assert_eq!(calls, 0);
    }
    // Flip every byte in turn: never a panic, and an error never delivers entries.
    for i in 0..n {
        let mut b = buf[..n].to_vec();
        b[i] ^= 0xA5;
        let mut calls = 0;
        if Tokens::decode(&b, |_| calls += 1).is_err() {
            assert_eq!(calls, 0);
        }
    }
}

#[test]
fn writer_reports_a_small_buffer() {
    let mut buf = vec![0u8; TokensWriter::HEADER_LEN + 8];
    let mut w = TokensWriter::new(&mut buf, EngineGauges::default()).unwrap();
    let r = w.push(&TokenEntry {
        request_id: 1,
        tokens: &[1, 2, 3],
        logprobs: None,
        finish: Finish::None,
        error: ErrorCode::None,
        prompt_tokens: 1,
    });
    assert!(matches!(r, Err(WireError::BufferTooSmall { .. })));
}
