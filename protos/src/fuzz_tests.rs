//! Property tests of every decoder against hostile input: arbitrary bytes, and valid records with
//! one word overwritten by an arbitrary (often huge) value. A decoder may accept or refuse; it
//! must never panic, never read past its input and never allocate by a corrupt count, and what it
//! accepts must be self-consistent.

use proptest::prelude::*;

use crate::join::{JoinReply, JoinRequest};
use crate::plan;
use crate::records::{
    Cancel, Draining, EngineGauges, EntryLogprobs, ErrorCode, Finish, GrammarWire, Hello, Release,
    SamplingWire, Submit, TokenEntry, Tokens, TokensWriter, peek_kind,
};

/// Runs every record decoder over `bytes`.
fn decode_all(bytes: &[u8]) {
    let _ = peek_kind(bytes);
    let _ = Submit::peek_request_id(bytes);
    if let Ok(s) = Submit::decode(bytes) {
        // Whatever it accepts fits in what it read.
        assert!(s.encoded_len() <= bytes.len());
        assert!(s.prior_output_len as usize <= s.prompt.len());
    }
    let _ = Cancel::decode(bytes);
    let _ = Draining::decode(bytes);
    let _ = Release::decode(bytes);
    let _ = Hello::decode(bytes);
    let mut tokens = 0usize;
    if Tokens::decode(bytes, |e| tokens += e.tokens.len()).is_ok() {
        assert!(tokens * 4 <= bytes.len());
    }
    if let Ok(plan::PlanMsg::Step { seqs, .. }) = plan::decode(bytes) {
        let words: usize = seqs
            .iter()
            .map(|s| s.new_blocks.len() + s.new_tokens.len())
            .sum();
        assert!(words * 4 <= bytes.len());
    }
}

fn submit_bytes(prompt: Vec<u32>, stops: Vec<u32>, prior: u32) -> Vec<u8> {
    let s = Submit {
        request_id: 7,
        sampling: SamplingWire::default(),
        max_tokens: 9,
        min_tokens: 0,
        logprobs: 1,
        ignore_eos: false,
        stop_token_ids: stops,
        prior_output_len: prior.min(prompt.len() as u32),
        prompt,
        grammar: (prior % 2 == 1).then(|| GrammarWire {
            kind: 3,
            text: "[a-z]+".into(),
        }),
    };
    let mut buf = vec![0u8; s.encoded_len()];
    s.encode(&mut buf).unwrap();
    buf
}

fn tokens_bytes(entries: &[(Vec<u32>, bool)]) -> Vec<u8> {
    let len = TokensWriter::HEADER_LEN
        + entries
            .iter()
            .map(|(t, lp)| TokensWriter::entry_len(t.len(), lp.then_some(2)))
            .sum::<usize>();
    let mut buf = vec![0u8; len];
    let mut w = TokensWriter::new(&mut buf, EngineGauges::default()).unwrap();
    for (i, (toks, lp)) in entries.iter().enumerate() {
        let chosen = vec![-0.5f32; toks.len()];
        let top = vec![(3u32, -1.0f32); toks.len() * 2];
        let logprobs = lp.then_some(EntryLogprobs {
            num_top: 2,
            chosen: &chosen,
            top: &top,
        });
        w.push(&TokenEntry {
            request_id: i as u64,
            tokens: toks,
            logprobs,
            finish: Finish::None,
            error: ErrorCode::None,
            prompt_tokens: 3,
        })
        .unwrap();
    }
    let n = w.finish();
    buf.truncate(n);
    buf
}

fn plan_bytes(seqs: &[(Vec<u32>, Vec<u32>)]) -> Vec<u8> {
    let mut out = Vec::new();
    plan::begin_step(&mut out, 5, seqs.len(), &[1, 2], &[3]).unwrap();
    for (i, (blocks, toks)) in seqs.iter().enumerate() {
        plan::push_seq(&mut out, i as u64, 4, toks.len(), true, blocks, toks).unwrap();
    }
    out
}

/// Overwrites the 4-byte word at `at` (modulo the length) with `value`.
fn poke(mut bytes: Vec<u8>, at: usize, value: u32) -> Vec<u8> {
    if bytes.len() >= 4 {
        let at = (at % (bytes.len() / 4)) * 4;
        bytes[at..at + 4].copy_from_slice(&value.to_ne_bytes());
    }
    bytes
}

fn hostile_word() -> impl Strategy<Value = u32> {
    prop_oneof![
        any::<u32>(),
        Just(u32::MAX),
        Just(0x8000_0000),
        Just(0),
        0u32..64
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic_a_decoder(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        decode_all(&bytes);
    }

    #[test]
    fn a_corrupted_word_in_a_valid_record_is_accepted_or_refused(
        prompt in prop::collection::vec(any::<u32>(), 1..40),
        stops in prop::collection::vec(any::<u32>(), 0..6),
        prior in 0u32..40,
        entries in prop::collection::vec((prop::collection::vec(any::<u32>(), 0..6), any::<bool>()), 0..5),
        seqs in prop::collection::vec((prop::collection::vec(any::<u32>(), 0..4), prop::collection::vec(any::<u32>(), 0..6)), 0..4),
        at in any::<usize>(),
        value in hostile_word(),
        cut in any::<usize>(),
    ) {
        for record in [submit_bytes(prompt, stops, prior), tokens_bytes(&entries), plan_bytes(&seqs)] {
            decode_all(&record);
            let poked = poke(record.clone(), at, value);
            decode_all(&poked);
            // Truncated anywhere.
            let cut = cut % (record.len() + 1);
            decode_all(&record[..cut]);
        }
    }

    #[test]
    fn join_lines_parse_or_refuse(line in "\\PC{0,600}", pid in any::<u32>(), slot in any::<u64>()) {
        let _ = JoinRequest::parse(&line);
        let _ = JoinReply::parse(&line);
        for l in [
            format!("ringserve-join 1 wire=3 pid={line}\n"),
            format!("ringserve-join {pid} wire={slot} pid={pid}"),
            format!("ok slot={slot} rings={line}"),
            format!("ok slot={line} rings=x"),
        ] {
            if let Ok(r) = JoinRequest::parse(&l) {
                prop_assert!(r.pid != 0);
            }
            if let Ok(JoinReply::Ok { rings, .. }) = JoinReply::parse(&l) {
                prop_assert!(!rings.is_empty() && rings.len() <= 200 && !rings.contains('/'));
            }
        }
        // Whatever a reply says, its line is one line that parses back.
        let refused = JoinReply::Refused(line.clone()).to_line();
        prop_assert_eq!(refused.matches('\n').count(), 1);
        prop_assert!(matches!(JoinReply::parse(&refused), Ok(JoinReply::Refused(_))));
    }
}
