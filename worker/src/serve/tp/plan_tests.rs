use super::*;
use crate::kv::BlockId;
use crate::scheduler::ScheduledSeq;

fn sched(seq: u64, num_computed: usize, num_tokens: usize, blocks: &[u32]) -> ScheduledSeq {
    ScheduledSeq {
        seq: SeqId(seq),
        num_computed,
        num_tokens,
        sample: true,
        new_blocks: blocks.iter().map(|&b| BlockId(b)).collect(),
    }
}

fn decode_step(bytes: &[u8]) -> (u64, Vec<PlanSeq>, Vec<u64>, Vec<u64>) {
    match decode(bytes).expect("decode") {
        PlanMsg::Step {
            step,
            seqs,
            preempted,
            finished,
        } => (step, seqs, preempted, finished),
        PlanMsg::Shutdown => panic!("unexpected shutdown"),
    }
}

/// Two sequences over three steps: prompts go once, then one sampled token per decode; the
/// mirror rebuilds the same token ids, positions and block tables rank 0 would run.
#[test]
fn diffs_carry_prompts_once_and_mirror_rebuilds_batches() {
    let mut tokens: HashMap<SeqId, Vec<u32>> =
        HashMap::from([(SeqId(7), vec![1, 2, 3, 4, 5]), (SeqId(9), vec![8, 9])]);
    let mut enc = PlanEncoder::default();
    let mut mirror = PlanMirror::default();
    let mut buf = Vec::new();

    // Step 0: seq 7 prefills a chunk of 3, seq 9 its whole prompt.
    let plan = StepPlan {
        seqs: vec![sched(7, 0, 3, &[4]), sched(9, 0, 2, &[5])],
        ..StepPlan::default()
    };
    enc.encode(&plan, |id| tokens.get(&id).map(Vec::as_slice), &mut buf)
        .expect("encode");
    let (step, seqs, pre, fin) = decode_step(&buf);
    assert_eq!(seqs[0].new_tokens, [1, 2, 3]);
    let inputs = mirror.apply(step, &seqs, &pre, &fin).expect("apply");
    assert_eq!(inputs.token_ids, [1, 2, 3, 8, 9]);
    assert_eq!(inputs.positions, [0, 1, 2, 0, 1]);
    assert_eq!(inputs.tables, [vec![4], vec![5]]);

    // Step 1: seq 9 sampled 10 and decodes; seq 7 finishes its prompt, seq 9 gets a new block.
    tokens.get_mut(&SeqId(9)).expect("seq").push(10);
    let plan = StepPlan {
        seqs: vec![sched(9, 2, 1, &[6]), sched(7, 3, 2, &[])],
        ..StepPlan::default()
    };
    enc.encode(&plan, |id| tokens.get(&id).map(Vec::as_slice), &mut buf)
        .expect("encode");
    let (step, seqs, pre, fin) = decode_step(&buf);
    assert_eq!(seqs[0].new_tokens, [10]);
    assert_eq!(seqs[1].new_tokens, [4, 5]);
    let inputs = mirror.apply(step, &seqs, &pre, &fin).expect("apply");
    assert_eq!(inputs.token_ids, [10, 4, 5]);
    assert_eq!(inputs.positions, [2, 3, 4]);
    assert_eq!(inputs.tables, [vec![5, 6], vec![4]]);
    let batch_seqs = inputs.seq_inputs();
    assert_eq!(
        (batch_seqs[1].query_start, batch_seqs[1].context_len),
        (1, 5)
    );

    // Step 2: seq 9 finished; seq 7 was preempted and is re-admitted with a fresh table.
    tokens.get_mut(&SeqId(7)).expect("seq").push(11);
    let plan = StepPlan {
        seqs: vec![sched(7, 0, 6, &[2, 3])],
        preempted: vec![SeqId(7)],
        finished: vec![SeqId(9)],
    };
    enc.encode(&plan, |id| tokens.get(&id).map(Vec::as_slice), &mut buf)
        .expect("encode");
    let (step, seqs, pre, fin) = decode_step(&buf);
    assert_eq!(seqs[0].new_tokens, [11], "known tokens are not resent");
    let inputs = mirror.apply(step, &seqs, &pre, &fin).expect("apply");
    assert_eq!(inputs.token_ids, [1, 2, 3, 4, 5, 11]);
    assert_eq!(inputs.tables, [vec![2, 3]]);
    assert_eq!(mirror.len(), 1);
}

fn sample_record() -> Vec<u8> {
    let tokens = [1u32, 2, 3];
    let plan = StepPlan {
        seqs: vec![sched(3, 0, 3, &[1])],
        preempted: vec![SeqId(4)],
        finished: vec![SeqId(5)],
    };
    let mut buf = Vec::new();
    PlanEncoder::default()
        .encode(&plan, |_| Some(&tokens[..]), &mut buf)
        .expect("encode");
    buf
}

#[test]
fn every_truncation_is_a_typed_error() {
    let buf = sample_record();
    assert!(decode(&buf).is_ok());
    for len in 0..buf.len() {
        let err = decode(&buf[..len]).expect_err("truncated");
        assert!(
            matches!(err, PlanError::Wire(PlanWireError::Truncated { .. })),
            "{len}: {err}"
        );
    }
    let mut long = buf.clone();
    long.extend_from_slice(&[0; 4]);
    assert_eq!(
        decode(&long),
        Err(PlanError::Wire(PlanWireError::TrailingBytes(4)))
    );
}

#[test]
fn corrupt_fields_are_typed_errors() {
    let buf = sample_record();
    let with = |word: usize, v: u32| {
        let mut b = buf.clone();
        b[word * 4..word * 4 + 4].copy_from_slice(&v.to_le_bytes());
        decode(&b)
    };
    assert!(matches!(
        with(0, 0xdead),
        Err(PlanError::Wire(PlanWireError::BadMagic(_)))
    ));
    assert!(matches!(
        with(1, 99),
        Err(PlanError::Wire(PlanWireError::Version(99)))
    ));
    assert!(matches!(
        with(2, 7),
        Err(PlanError::Wire(PlanWireError::Invalid { .. }))
    ));
    // Absurd counts fail on length before allocating.
    assert!(matches!(
        with(5, u32::MAX),
        Err(PlanError::Wire(PlanWireError::Truncated { .. }))
    ));
    assert!(matches!(
        with(6, u32::MAX),
        Err(PlanError::Wire(PlanWireError::Truncated { .. }))
    ));
    // Sample flag of the first sequence (after 8 header words and 2 ids of 2 words).
    assert!(matches!(
        with(8 + 4 + 4, 2),
        Err(PlanError::Wire(PlanWireError::Invalid { .. }))
    ));
    // Every single-byte flip decodes or fails cleanly, never panics.
    for i in 0..buf.len() {
        let mut b = buf.clone();
        b[i] ^= 0xa5;
        let _ = decode(&b);
    }
    let mut b = Vec::new();
    encode_shutdown(&mut b);
    assert_eq!(decode(&b), Ok(PlanMsg::Shutdown));
}

#[test]
fn plans_that_do_not_fit_the_mirror_are_errors() {
    let mut mirror = PlanMirror::default();
    let seq = PlanSeq {
        seq: 1,
        num_computed: 0,
        num_tokens: 4,
        sample: true,
        new_blocks: vec![1],
        new_tokens: vec![1, 2],
    };
    let err = mirror
        .apply(0, &[seq], &[], &[])
        .expect_err("too few tokens");
    assert!(matches!(err, PlanError::Inconsistent(_)), "{err}");
    let err = mirror.apply(5, &[], &[], &[]).expect_err("skipped step");
    assert!(matches!(err, PlanError::Inconsistent(_)), "{err}");
}
