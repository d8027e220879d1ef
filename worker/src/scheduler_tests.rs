//! Scheduler tests: plans, budgets, chunking, FCFS, preemption order, and a randomized run that checks
//! the KV invariants after every step.

use super::*;

fn config(budget: usize, max_seqs: usize, blocks: usize, block_size: usize) -> SchedulerConfig {
    SchedulerConfig {
        max_num_batched_tokens: budget,
        max_prefill_tokens_while_decoding: None,
        max_num_seqs: max_seqs,
        max_model_len: 1 << 20,
        num_kv_blocks: blocks,
        block_size,
        enable_prefix_caching: true,
        eos_token_ids: vec![0],
    }
}

fn req(id: u64, len: usize, max_tokens: usize) -> Request {
    let mut r = Request::new(
        SeqId(id),
        (0..len as u32).map(|i| 1000 * id as u32 + i + 1).collect(),
        max_tokens,
    );
    r.ignore_eos = true;
    r
}

/// Feeds token 7 to every sampling entry.
fn advance(s: &mut Scheduler, plan: &StepPlan) -> Vec<SeqUpdate> {
    let n = plan.seqs.iter().filter(|e| e.sample).count();
    s.update(plan, &vec![7; n]).expect("update")
}

fn entry(seq: u64, num_computed: usize, num_tokens: usize, sample: bool) -> ScheduledSeq {
    ScheduledSeq {
        seq: SeqId(seq),
        num_computed,
        num_tokens,
        sample,
        new_blocks: Vec::new(),
    }
}

/// The plan's entries without their block lists.
fn stripped(seqs: &[ScheduledSeq]) -> Vec<ScheduledSeq> {
    seqs.iter()
        .map(|e| ScheduledSeq {
            new_blocks: Vec::new(),
            ..e.clone()
        })
        .collect()
}

#[test]
fn prefill_is_chunked_to_the_budget() {
    let mut s = Scheduler::new(config(7, 8, 64, 4));
    s.add(req(1, 20, 2), 0);
    let mut chunks = Vec::new();
    loop {
        let plan = s.schedule().expect("schedule");
        if plan.is_empty() {
            break;
        }
        assert!(plan.num_tokens() <= 7);
        chunks.extend(stripped(&plan.seqs));
        advance(&mut s, &plan);
    }
    assert_eq!(
        chunks,
        vec![
            entry(1, 0, 7, false),
            entry(1, 7, 7, false),
            entry(1, 14, 6, true),
            entry(1, 20, 1, true)
        ]
    );
    assert_eq!(s.kv().pool().num_used(), 0);
}

#[test]
fn decodes_go_first_then_prefills_fcfs() {
    let mut s = Scheduler::new(config(10, 8, 64, 4));
    s.add(req(1, 3, 5), 0);
    let plan = s.schedule().expect("schedule");
    advance(&mut s, &plan);
    s.add(req(2, 20, 5), 0);
    s.add(req(3, 2, 5), 0);
    let plan = s.schedule().expect("schedule");
    // The decode of 1 first; 2 gets the rest of the budget; 3 waits behind it (FCFS).
    assert_eq!(
        stripped(&plan.seqs),
        vec![entry(1, 3, 1, true), entry(2, 0, 9, false)]
    );
    advance(&mut s, &plan);
    let plan = s.schedule().expect("schedule");
    assert_eq!(
        stripped(&plan.seqs),
        vec![entry(1, 4, 1, true), entry(2, 9, 9, false)]
    );
    advance(&mut s, &plan);
    let plan = s.schedule().expect("schedule");
    assert_eq!(
        stripped(&plan.seqs),
        vec![
            entry(1, 5, 1, true),
            entry(2, 18, 2, true),
            entry(3, 0, 2, true)
        ]
    );
}

#[test]
fn max_num_seqs_caps_admission() {
    let mut s = Scheduler::new(config(100, 2, 64, 4));
    for id in 1..=3 {
        s.add(req(id, 3, 5), 0);
    }
    let plan = s.schedule().expect("schedule");
    assert_eq!(plan.seqs.len(), 2);
    assert_eq!((s.num_running(), s.num_waiting()), (2, 1));
}

#[test]
fn preemption_takes_the_latest_arrival_and_requeues_it_first() {
    // 6 usable blocks of 2 tokens.
    let mut s = Scheduler::new(config(100, 8, 7, 2));
    s.add(req(1, 4, 20), 0);
    s.add(req(2, 4, 20), 0);
    s.add(req(3, 3, 20), 0);
    let plan = s.schedule().expect("schedule");
    assert_eq!(plan.seqs.len(), 3, "2 + 2 + 2 blocks");
    advance(&mut s, &plan);
    // Decodes: 1 needs a third block (5 tokens); none is free, so 3 (the latest) is preempted.
    let plan = s.schedule().expect("schedule");
    assert_eq!(plan.preempted, vec![SeqId(3)]);
    assert_eq!(
        plan.seqs.iter().map(|e| e.seq.0).collect::<Vec<_>>(),
        vec![1, 2]
    );
    assert_eq!(s.seq(SeqId(3)).map(Sequence::num_computed), Some(0));
    assert!(s.kv().block_table(SeqId(3)).is_empty());
    s.add(req(4, 1, 20), 0);
    advance(&mut s, &plan);
    // 3 is first in line again (ahead of 4), with its sampled token kept for the recompute.
    assert_eq!(s.seq(SeqId(3)).map(|q| q.tokens().len()), Some(4));
    assert_eq!(
        s.waiting.iter().map(|q| q.0).collect::<Vec<_>>(),
        vec![3, 4]
    );
    s.kv().pool().check_invariants().expect("invariants");
}

#[test]
fn finishes_on_max_tokens_and_frees() {
    let mut s = Scheduler::new(config(100, 8, 64, 4));
    s.add(req(1, 3, 2), 0);
    let plan = s.schedule().expect("schedule");
    assert_eq!(
        advance(&mut s, &plan),
        vec![SeqUpdate {
            seq: SeqId(1),
            token: 7,
            finish: None
        }]
    );
    let plan = s.schedule().expect("schedule");
    let up = advance(&mut s, &plan);
    assert_eq!(up[0].finish, Some(FinishReason::Length));
    assert!(!s.contains(SeqId(1)));
    assert_eq!(s.kv().pool().num_used(), 0);
}

/// A small deterministic generator for the randomized test.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n
    }
}

#[test]
fn randomized_runs_keep_kv_invariants() {
    let (mut preemptions, mut hits) = (0, 0);
    for seed in 0..20 {
        let mut rng = Lcg(seed);
        let block_size = 1 + rng.below(5) as usize;
        let blocks = 12 + rng.below(40) as usize;
        let budget = 1 + rng.below(40) as usize;
        let mut s = Scheduler::new(config(
            budget,
            1 + rng.below(6) as usize,
            blocks,
            block_size,
        ));
        let mut next_id = 0;
        let mut steps = 0;
        // Block tables rebuilt from the plans alone, as a TP rank would.
        let mut mirror: std::collections::HashMap<SeqId, Vec<BlockId>> = Default::default();
        loop {
            if next_id < 30 && rng.below(3) == 0 {
                // Prompts from a small alphabet, so prefixes repeat and the cache gets hits.
                let len = 1 + rng.below(((blocks - 1) * block_size / 2) as u64) as usize;
                let prompt: Vec<u32> = (0..len).map(|_| 1 + rng.below(2) as u32).collect();
                let mut r = Request::new(SeqId(next_id), prompt, 1 + rng.below(8) as usize);
                r.ignore_eos = true;
                s.add(r, 0);
                next_id += 1;
            }
            if rng.below(10) == 0 && next_id > 0 {
                s.abort(SeqId(rng.below(next_id))).expect("abort");
            }
            let plan = s.schedule().expect("schedule");
            for id in plan.finished.iter().chain(&plan.preempted) {
                mirror.remove(id);
            }
            for e in &plan.seqs {
                mirror
                    .entry(e.seq)
                    .or_default()
                    .extend_from_slice(&e.new_blocks);
                assert_eq!(
                    mirror[&e.seq],
                    s.kv().block_table(e.seq),
                    "seed {seed}: mirrored table"
                );
            }
            assert!(plan.num_tokens() <= budget, "seed {seed}: over budget");
            assert!(plan.seqs.len() <= s.config().max_num_seqs);
            for e in &plan.seqs {
                let table = s.kv().block_table(e.seq).len();
                assert!(
                    table * block_size >= e.num_computed + e.num_tokens,
                    "seed {seed}: table too short"
                );
            }
            for id in &s.waiting {
                assert!(
                    s.kv().block_table(*id).is_empty(),
                    "seed {seed}: a waiting sequence holds blocks"
                );
            }
            let toks: Vec<u32> = (0..plan.seqs.iter().filter(|e| e.sample).count())
                .map(|_| 1 + rng.below(2) as u32)
                .collect();
            s.update(&plan, &toks).expect("update");
            let pool = s.kv().pool();
            pool.check_invariants()
                .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
            assert_eq!(pool.num_free() + pool.num_used(), pool.num_usable());
            steps += 1;
            if next_id >= 30 && s.num_running() + s.num_waiting() == 0 {
                break;
            }
            assert!(steps < 20_000, "seed {seed}: no progress");
        }
        assert_eq!(s.kv().pool().num_used(), 0, "seed {seed}: blocks leaked");
        let last = s.schedule().expect("schedule");
        for id in &last.finished {
            mirror.remove(id);
        }
        assert!(
            mirror.is_empty(),
            "seed {seed}: plans never reported {:?} as ended",
            mirror.keys()
        );
        assert_eq!(s.kv().num_seqs(), 0);
        preemptions += s.num_preemptions();
        hits += s.kv().prefix_cache_stats().1;
    }
    assert!(
        preemptions > 0 && hits > 0,
        "the runs should exercise preemption ({preemptions}) and hits ({hits})"
    );
}

#[test]
fn a_prefix_being_computed_is_computed_once() {
    // Three requests share 8 blocks (32 tokens) and differ in the last 3 tokens; the budget would
    // fit all three prompts in one step.
    let shared: Vec<u32> = (1..=32).collect();
    let prompt = |tail: u32| -> Vec<u32> {
        shared
            .iter()
            .copied()
            .chain([tail, tail + 1, tail + 2])
            .collect()
    };
    let mut s = Scheduler::new(config(1000, 8, 64, 4));
    for (id, tail) in [(1, 100), (2, 200), (3, 300)] {
        let mut r = Request::new(SeqId(id), prompt(tail), 4);
        r.ignore_eos = true;
        s.add(r, 0);
    }
    // An unrelated request behind them is not held up.
    s.add(req(9, 10, 4), 0);
    let plan = s.schedule().expect("schedule");
    assert_eq!(
        stripped(&plan.seqs),
        vec![entry(1, 0, 35, true), entry(9, 0, 10, true)],
        "2 and 3 wait while 1 computes their prefix"
    );
    assert_eq!(s.num_prefix_waits(), 2);
    advance(&mut s, &plan);
    // Next step: the prefix is cached; 2 and 3 compute only their own tails.
    let plan = s.schedule().expect("schedule");
    let admitted: Vec<_> = stripped(&plan.seqs)
        .into_iter()
        .filter(|e| e.seq.0 == 2 || e.seq.0 == 3)
        .collect();
    assert_eq!(admitted, vec![entry(2, 32, 3, true), entry(3, 32, 3, true)]);
    let (queried, hit) = s.kv().prefix_cache_stats();
    assert_eq!((queried, hit), (35 + 10 + 35 + 35, 64));
}

#[test]
fn a_waiter_goes_on_when_the_owner_of_its_prefix_leaves() {
    let shared: Vec<u32> = (1..=16).collect();
    let mut s = Scheduler::new(config(1000, 8, 64, 4));
    for id in [1, 2] {
        let mut r = Request::new(
            SeqId(id),
            shared.iter().copied().chain([50 + id as u32]).collect(),
            4,
        );
        r.ignore_eos = true;
        s.add(r, 0);
    }
    let plan = s.schedule().expect("schedule");
    assert_eq!(stripped(&plan.seqs), vec![entry(1, 0, 17, true)]);
    // 1 is cancelled before its step is applied: nothing was cached, and 2 computes it all.
    s.abort(SeqId(1)).expect("abort");
    let plan = s.schedule().expect("schedule");
    assert_eq!(stripped(&plan.seqs), vec![entry(2, 0, 17, true)]);
    // Without prefix caching nothing waits.
    let mut cfg = config(1000, 8, 64, 4);
    cfg.enable_prefix_caching = false;
    let mut s = Scheduler::new(cfg);
    for id in [1, 2] {
        s.add(Request::new(SeqId(id), shared.clone(), 4), 0);
    }
    assert_eq!(s.schedule().expect("schedule").seqs.len(), 2);
}

#[test]
fn n_completions_of_one_prompt_prefill_it_once() {
    // `n` = 4: four sequences with the same 40-token prompt, submitted together.
    let prompt: Vec<u32> = (1..=40).collect();
    let mut s = Scheduler::new(config(1000, 8, 64, 4));
    for id in 1..=4 {
        let mut r = Request::new(SeqId(id), prompt.clone(), 4);
        r.ignore_eos = true;
        s.add(r, id);
    }
    let plan = s.schedule().expect("schedule");
    assert_eq!(stripped(&plan.seqs), vec![entry(1, 0, 40, true)]);
    advance(&mut s, &plan);
    // The others take the 9 full blocks the first cached (all but the block with the last token,
    // whose logits each needs) and compute 4 tokens each.
    let plan = s.schedule().expect("schedule");
    let others: Vec<_> = stripped(&plan.seqs)
        .into_iter()
        .filter(|e| e.seq.0 > 1)
        .collect();
    assert_eq!(
        others,
        vec![
            entry(2, 36, 4, true),
            entry(3, 36, 4, true),
            entry(4, 36, 4, true)
        ]
    );
}

#[test]
fn prefill_tokens_are_capped_in_steps_that_decode() {
    let mut cfg = config(100, 8, 128, 4);
    cfg.max_prefill_tokens_while_decoding = Some(10);
    let mut s = Scheduler::new(cfg);
    s.add(req(1, 5, 20), 0);
    // Alone, a prompt takes the whole budget.
    let plan = s.schedule().expect("schedule");
    assert_eq!(stripped(&plan.seqs), vec![entry(1, 0, 5, true)]);
    advance(&mut s, &plan);
    // With a decode in the step, prefills (running and admitted) get 10 tokens in all.
    s.add(req(2, 30, 4), 0);
    let plan = s.schedule().expect("schedule");
    assert_eq!(
        stripped(&plan.seqs),
        vec![entry(1, 5, 1, true), entry(2, 0, 10, false)]
    );
    advance(&mut s, &plan);
    let plan = s.schedule().expect("schedule");
    assert_eq!(
        stripped(&plan.seqs),
        vec![entry(1, 6, 1, true), entry(2, 10, 10, false)]
    );
}

#[test]
fn a_step_is_planned_ahead_of_its_tokens() {
    // Blocks of 4; prompts of 3 and 6 tokens, admitted whole.
    let mut s = Scheduler::new(config(64, 4, 16, 4));
    s.add(req(1, 3, 10), 0);
    s.add(req(2, 6, 10), 0);
    let prefill = s.schedule().expect("plan");
    // The prompts' first draws are the next step's decodes, fed row for row.
    let first = s.plan_ahead(&prefill).expect("planned ahead");
    assert_eq!(
        stripped(&first.plan.seqs),
        vec![entry(1, 3, 1, true), entry(2, 6, 1, true)]
    );
    assert_eq!(first.fed, vec![0, 1]);
    advance(&mut s, &prefill);
    advance(&mut s, &first.plan);
    let decode = s.schedule().expect("plan");
    assert_eq!(
        stripped(&decode.seqs),
        vec![entry(1, 4, 1, true), entry(2, 7, 1, true)]
    );
    // The step after this one: sequence 1's position 5 lies in its second block; sequence 2's
    // 8 opens its third, taken now.
    let ahead = s.plan_ahead(&decode).expect("planned ahead");
    assert_eq!(
        stripped(&ahead.plan.seqs),
        vec![entry(1, 5, 1, true), entry(2, 8, 1, true)]
    );
    assert_eq!(ahead.fed, vec![0, 1]);
    assert!(ahead.plan.seqs[0].new_blocks.is_empty());
    assert_eq!(ahead.plan.seqs[1].new_blocks.len(), 1);
    assert_eq!(s.kv().block_table(SeqId(2)).len(), 3);
    // Applied in order, the two steps leave what two synchronous steps would.
    advance(&mut s, &decode);
    advance(&mut s, &ahead.plan);
    assert_eq!(s.seq(SeqId(1)).map(|q| q.num_computed()), Some(6));
    assert_eq!(s.seq(SeqId(2)).map(|q| q.tokens().len()), Some(10));
    let next = s.schedule().expect("plan");
    assert_eq!(
        stripped(&next.seqs),
        vec![entry(1, 6, 1, true), entry(2, 9, 1, true)]
    );
}

#[test]
fn no_step_with_prompt_tokens_is_planned_ahead() {
    // A prompt chunked by the budget of 8 goes on in the next step.
    let mut s = Scheduler::new(config(8, 4, 64, 4));
    s.add(req(1, 3, 10), 0);
    s.add(req(2, 20, 10), 0);
    let first = s.schedule().expect("plan");
    assert_eq!(
        stripped(&first.seqs),
        vec![entry(1, 0, 3, true), entry(2, 0, 5, false)]
    );
    assert!(s.plan_ahead(&first).is_none());
    // A waiting request a step could admit.
    let mut s = Scheduler::new(config(64, 4, 64, 4));
    s.add(req(1, 3, 10), 0);
    let prefill = s.schedule().expect("plan");
    s.add(req(2, 9, 10), 0);
    assert!(s.plan_ahead(&prefill).is_none());
    // One that waits for a full batch does not stop the decodes; once a sequence ends by
    // length at the step on the device, it could be admitted.
    let mut s = Scheduler::new(config(64, 2, 64, 4));
    s.add(req(1, 3, 10), 0);
    s.add(req(2, 3, 1), 0);
    let both = s.schedule().expect("plan");
    s.add(req(3, 3, 10), 0);
    assert!(s.plan_ahead(&both).is_none(), "request 2 ends by length");
    let mut s = Scheduler::new(config(64, 2, 64, 4));
    s.add(req(1, 3, 10), 0);
    s.add(req(2, 3, 10), 0);
    let both = s.schedule().expect("plan");
    s.add(req(3, 3, 10), 0);
    let ahead = s.plan_ahead(&both).expect("planned ahead");
    assert_eq!(
        ahead.plan.seqs.len(),
        2,
        "max_num_seqs 2 keeps request 3 waiting"
    );
    assert_eq!(s.num_waiting(), 1);
}

#[test]
fn a_step_planned_ahead_leaves_out_endings_by_length_and_never_preempts() {
    // Sequence 1 draws its last token (max_tokens 2) at its first decode: the step after it
    // leaves it out, and sequence 2 takes its draw from index 1.
    let mut s = Scheduler::new(config(64, 4, 16, 4));
    s.add(req(1, 3, 2), 0);
    s.add(req(2, 3, 10), 0);
    let prefill = s.schedule().expect("plan");
    advance(&mut s, &prefill);
    let decode = s.schedule().expect("plan");
    let ahead = s.plan_ahead(&decode).expect("planned ahead");
    assert_eq!(stripped(&ahead.plan.seqs), vec![entry(2, 4, 1, true)]);
    assert_eq!(ahead.fed, vec![1]);
    // The context limit: 3 prompt tokens + 2 output reach max_model_len 5; nothing is left.
    let mut cfg = config(64, 4, 16, 4);
    cfg.max_model_len = 5;
    let mut s = Scheduler::new(cfg);
    s.add(req(1, 3, 10), 0);
    let prefill = s.schedule().expect("plan");
    advance(&mut s, &prefill);
    let decode = s.schedule().expect("plan");
    assert!(
        s.plan_ahead(&decode).is_none(),
        "max_model_len reached at this step"
    );
    let mut s = Scheduler::new(config(64, 2, 16, 4));
    s.add(req(1, 3, 10), 0);
    s.add(req(2, 3, 10), 0);
    let both = s.schedule().expect("plan");
    // A running sequence the step before left out: its next step needs that step's tokens.
    let partial = StepPlan {
        seqs: both.seqs[..1].to_vec(),
        ..StepPlan::default()
    };
    assert!(s.plan_ahead(&partial).is_none());
    // Blocks: a 7-token prompt's decode computes position 7 in its second block; the step
    // after it, position 8, takes a third, which 3 usable blocks have and 2 do not.
    for (blocks, fits) in [(4, true), (3, false)] {
        let mut s = Scheduler::new(config(64, 4, blocks, 4));
        s.add(req(1, 7, 10), 0);
        let prefill = s.schedule().expect("plan");
        advance(&mut s, &prefill);
        let decode = s.schedule().expect("plan");
        assert_eq!(stripped(&decode.seqs), vec![entry(1, 7, 1, true)]);
        assert_eq!(s.plan_ahead(&decode).is_some(), fits, "{blocks} blocks");
        assert_eq!(s.num_preemptions(), 0);
    }
}
