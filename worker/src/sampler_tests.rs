//! Tests of the host sampler.

use super::*;

/// Logits whose softmax is exactly `probs`.
fn logits_of(probs: &[f32]) -> Vec<f32> {
    probs.iter().map(|p| p.ln()).collect()
}

fn ids(c: &[(u32, f32)]) -> Vec<u32> {
    c.iter().map(|&(t, _)| t).collect()
}

fn params(f: impl FnOnce(&mut SamplingParams)) -> SamplingParams {
    let mut p = SamplingParams::default();
    f(&mut p);
    p
}

// Probabilities, deliberately not in token order: token 3 is the most likely.
const PROBS: [f32; 5] = [0.05, 0.3, 0.1, 0.5, 0.05];

#[test]
fn top_k_keeps_exactly_k() {
    let l = logits_of(&PROBS);
    assert_eq!(ids(&candidates(&l, &params(|p| p.top_k = 1))), vec![3]);
    assert_eq!(ids(&candidates(&l, &params(|p| p.top_k = 2))), vec![3, 1]);
    assert_eq!(
        ids(&candidates(&l, &params(|p| p.top_k = 3))),
        vec![3, 1, 2]
    );
    // Ties at the cut: lower id first.
    assert_eq!(
        ids(&candidates(&l, &params(|p| p.top_k = 4))),
        vec![3, 1, 2, 0]
    );
    assert_eq!(candidates(&l, &params(|p| p.top_k = 50)).len(), 5);
    let c = candidates(&l, &params(|p| p.top_k = 2));
    assert!(
        (c[0].1 - 0.625).abs() < 1e-6 && (c[1].1 - 0.375).abs() < 1e-6,
        "{c:?}"
    );
}

#[test]
fn top_p_keeps_the_smallest_set_reaching_p() {
    let l = logits_of(&PROBS);
    assert_eq!(ids(&candidates(&l, &params(|p| p.top_p = 0.4))), vec![3]);
    assert_eq!(ids(&candidates(&l, &params(|p| p.top_p = 0.5))), vec![3]);
    assert_eq!(
        ids(&candidates(&l, &params(|p| p.top_p = 0.75))),
        vec![3, 1]
    );
    assert_eq!(
        ids(&candidates(&l, &params(|p| p.top_p = 0.85))),
        vec![3, 1, 2]
    );
    assert_eq!(candidates(&l, &params(|p| p.top_p = 1.0)).len(), 5);
    // After top-k the mass is renormalized: {3: 0.625, 1: 0.375}; 0.6 keeps only token 3.
    assert_eq!(
        ids(&candidates(
            &l,
            &params(|p| {
                p.top_k = 2;
                p.top_p = 0.6;
            })
        )),
        vec![3]
    );
}

#[test]
fn min_p_drops_tokens_below_a_fraction_of_the_max() {
    let l = logits_of(&PROBS);
    assert_eq!(ids(&candidates(&l, &params(|p| p.min_p = 0.5))), vec![3, 1]);
    assert_eq!(
        ids(&candidates(&l, &params(|p| p.min_p = 0.19))),
        vec![3, 1, 2]
    );
    assert_eq!(
        ids(&candidates(&l, &params(|p| p.min_p = 0.09))),
        vec![3, 1, 2, 0, 4]
    );
    assert_eq!(ids(&candidates(&l, &params(|p| p.min_p = 1.0))), vec![3]);
}

#[test]
fn temperature_sharpens_and_zero_is_greedy() {
    let l = logits_of(&PROBS);
    assert_eq!(
        candidates(&l, &params(|p| p.temperature = 0.0)),
        vec![(3, 1.0)]
    );
    let hot = candidates(&l, &params(|p| p.temperature = 0.5));
    // p^(1/T) renormalized: 0.25 / (0.0025*2 + 0.09 + 0.01 + 0.25).
    assert!((hot[0].1 - 0.25 / 0.355).abs() < 1e-5, "{hot:?}");
    assert_eq!(argmax(&[1.0, 3.0, 3.0, f32::NAN]), 1);
    assert_eq!(argmax(&[f32::NAN, 0.5]), 1);
}

#[test]
fn sampling_frequencies_pass_chi_square() {
    let l = logits_of(&PROBS);
    let p = params(|_| {});
    let n = 20_000u64;
    let mut counts = [0u64; 5];
    for i in 0..n {
        counts[sample_with(&l, &p, uniform(42, i)) as usize] += 1;
    }
    let chi2: f64 = counts
        .iter()
        .zip(PROBS)
        .map(|(&c, p)| {
            let e = n as f64 * f64::from(p);
            (c as f64 - e).powi(2) / e
        })
        .sum();
    // 4 degrees of freedom: P(chi2 > 18.47) = 0.001.
    assert!(chi2 < 18.47, "chi2 = {chi2}, counts {counts:?}");
}

#[test]
fn uniform_draws_are_a_function_of_seed_and_index() {
    assert_eq!(uniform(7, 3), uniform(7, 3));
    assert_ne!(uniform(7, 3), uniform(7, 4));
    assert_ne!(uniform(7, 3), uniform(8, 3));
    for i in 0..1000 {
        let u = uniform(1, i);
        assert!((0.0..1.0).contains(&u));
    }
}

#[test]
fn repetition_penalty_follows_hf() {
    let mut l = vec![2.0, -2.0, 1.0, 4.0];
    let p = params(|p| p.repetition_penalty = 2.0);
    apply_penalties(
        &mut l,
        &p,
        History {
            prompt: &[0, 1],
            output: &[1],
        },
    );
    assert_eq!(l, vec![1.0, -4.0, 1.0, 4.0]);
}

#[test]
fn frequency_and_presence_penalties_follow_openai() {
    let mut l = vec![1.0; 4];
    let p = params(|p| {
        p.frequency_penalty = 0.5;
        p.presence_penalty = 0.25;
    });
    // Prompt tokens do not count; token 2 occurred twice in the output, token 3 once.
    apply_penalties(
        &mut l,
        &p,
        History {
            prompt: &[0, 0, 0],
            output: &[2, 3, 2],
        },
    );
    assert_eq!(l, vec![1.0, 1.0, 1.0 - 1.0 - 0.25, 1.0 - 0.5 - 0.25]);
}

#[test]
fn penalties_change_the_greedy_pick_and_logprobs_stay_raw() {
    let raw = vec![0.0, 3.0, 2.9];
    let p = SamplingParams {
        repetition_penalty: 1.5,
        ..SamplingParams::greedy()
    };
    let req = SampleRequest {
        params: &p,
        seed: 0,
        output_index: 1,
        history: History {
            prompt: &[],
            output: &[1],
        },
        logprobs: Some(2),
        banned: &[],
        allowed: None,
    };
    let (tok, lp) = sample_row(&raw, &req);
    assert_eq!(tok, 2);
    let lp = lp.expect("asked for logprobs");
    let z = (0f32.exp() + 3f32.exp() + 2.9f32.exp()).ln();
    assert_eq!(
        lp.top.iter().map(|t| t.token).collect::<Vec<_>>(),
        vec![1, 2]
    );
    assert!((lp.top[0].logprob - (3.0 - z)).abs() < 1e-5);
    assert!((lp.sampled.logprob - (2.9 - z)).abs() < 1e-5);
}

#[test]
fn banned_tokens_are_never_drawn_and_logprobs_stay_raw() {
    let raw = vec![0.0, 5.0, 1.0, 4.0];
    for params in [SamplingParams::greedy(), SamplingParams::default()] {
        for i in 0..64 {
            let req = SampleRequest {
                params: &params,
                seed: 3,
                output_index: i,
                history: History {
                    prompt: &[],
                    output: &[],
                },
                logprobs: Some(1),
                banned: &[1, 3],
                allowed: None,
            };
            let (tok, lp) = sample_row(&raw, &req);
            assert!(tok == 0 || tok == 2, "drew banned token {tok}");
            // The raw distribution's most likely token is still reported first.
            assert_eq!(lp.unwrap().top[0].token, 1);
        }
    }
    let greedy = SamplingParams::greedy();
    let open = SampleRequest {
        params: &greedy,
        seed: 3,
        output_index: 0,
        history: History {
            prompt: &[],
            output: &[],
        },
        logprobs: None,
        banned: &[],
        allowed: None,
    };
    assert_eq!(sample_row(&raw, &open).0, 1);
}

#[test]
fn a_grammar_mask_limits_the_draw_and_wins_over_banned_tokens() {
    let raw = vec![0.0, 5.0, 1.0, 4.0, 2.0];
    let mask = grammar::TokenMask::only(5, &[2, 4]);
    for params in [SamplingParams::greedy(), SamplingParams::default()] {
        for i in 0..64 {
            let req = SampleRequest {
                params: &params,
                seed: 5,
                output_index: i,
                history: History {
                    prompt: &[],
                    output: &[],
                },
                logprobs: Some(1),
                banned: &[4],
                allowed: Some(&mask),
            };
            let (tok, lp) = sample_row(&raw, &req);
            assert_eq!(tok, 2, "only 2 is both allowed and not banned");
            assert_eq!(lp.unwrap().top[0].token, 1, "logprobs stay raw");
            // Banning every allowed token leaves the grammar's choice.
            let all_banned = SampleRequest {
                banned: &[2, 4],
                ..req
            };
            let tok = sample_row(&raw, &all_banned).0;
            assert!(tok == 2 || tok == 4, "drew {tok}");
        }
    }
}

#[test]
fn raw_logprobs_are_sorted_and_normalized() {
    let l = logits_of(&PROBS);
    let lp = raw_logprobs(&l, 0, 5);
    let toks: Vec<u32> = lp.top.iter().map(|t| t.token).collect();
    assert_eq!(toks, vec![3, 1, 2, 0, 4]);
    let total: f32 = lp.top.iter().map(|t| t.logprob.exp()).sum();
    assert!((total - 1.0).abs() < 1e-5);
    assert_eq!(raw_logprobs(&l, 0, 0).top, vec![]);
    assert_eq!(raw_logprobs(&l, 0, 99).top.len(), 5);
}

#[test]
fn validation_names_the_field() {
    let bad = [
        (params(|p| p.temperature = -1.0), "temperature"),
        (params(|p| p.top_p = 0.0), "top_p"),
        (params(|p| p.min_p = 1.5), "min_p"),
        (params(|p| p.repetition_penalty = 0.0), "repetition_penalty"),
        (params(|p| p.frequency_penalty = 3.0), "frequency_penalty"),
        (
            params(|p| p.presence_penalty = f32::NAN),
            "presence_penalty",
        ),
    ];
    for (p, field) in bad {
        let err = p.validate().expect_err(field);
        assert!(err.starts_with(field), "{err}");
    }
    SamplingParams::default()
        .validate()
        .expect("default is valid");
}

/// The filters the slow, obvious way: sort everything, apply each filter, renormalize each time.
fn naive(logits: &[f32], p: &SamplingParams) -> Vec<u32> {
    let mut order: Vec<u32> = (0..logits.len() as u32).collect();
    order.sort_by(|a, b| {
        logits[*b as usize]
            .total_cmp(&logits[*a as usize])
            .then(a.cmp(b))
    });
    if p.top_k > 0 {
        order.truncate(p.top_k as usize);
    }
    let probs = |order: &[u32]| {
        let m = logits[order[0] as usize];
        let w: Vec<f64> = order
            .iter()
            .map(|&t| ((logits[t as usize] - m) as f64 / p.temperature as f64).exp())
            .collect();
        let z: f64 = w.iter().sum();
        w.into_iter().map(|x| x / z).collect::<Vec<_>>()
    };
    if p.top_p < 1.0 {
        let pr = probs(&order);
        let mut cum = 0.0;
        let keep = pr.iter().position(|&x| {
            cum += x;
            cum >= p.top_p as f64
        });
        order.truncate(keep.map_or(order.len(), |i| i + 1));
    }
    if p.min_p > 0.0 {
        let pr = probs(&order);
        let keep = pr
            .iter()
            .take_while(|&&x| x >= pr[0] * p.min_p as f64)
            .count();
        order.truncate(keep);
    }
    order
}

#[test]
fn large_rows_match_the_naive_filters() {
    let mut state = 12345u64;
    let mut next = || {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1);
        (state >> 40) as f32 / (1u64 << 24) as f32
    };
    for round in 0..12 {
        // Flat rows (top-p needs far more than the sorted head) and peaked ones.
        let spread = if round % 2 == 0 { 0.5 } else { 12.0 };
        let logits: Vec<f32> = (0..5000).map(|_| next() * spread).collect();
        let p = SamplingParams {
            temperature: 0.5 + next(),
            top_k: if round % 3 == 0 { 2000 } else { 0 },
            top_p: [1.0, 0.9, 0.5, 0.99][round % 4],
            min_p: if round % 5 == 0 { 0.3 } else { 0.0 },
            ..SamplingParams::default()
        };
        let fast = ids(&candidates(&logits, &p));
        assert_eq!(fast, naive(&logits, &p), "round {round}: {p:?}");
        let total: f32 = candidates(&logits, &p).iter().map(|c| c.1).sum();
        assert!((total - 1.0).abs() < 1e-3);
    }
}

#[test]
fn sampled_tokens_stay_in_the_candidate_set_with_the_right_frequencies() {
    let l = logits_of(&PROBS);
    for p in [
        params(|p| p.min_p = 0.5),
        params(|p| p.top_k = 2),
        params(|p| p.top_p = 0.75),
    ] {
        let cands = candidates(&l, &p);
        let n = 10_000u64;
        let mut counts = [0u64; 5];
        for i in 0..n {
            counts[sample_with(&l, &p, uniform(3, i)) as usize] += 1;
        }
        let chi2: f64 = cands
            .iter()
            .map(|&(t, q)| {
                let e = n as f64 * f64::from(q);
                (counts[t as usize] as f64 - e).powi(2) / e
            })
            .sum();
        let inside: u64 = cands.iter().map(|&(t, _)| counts[t as usize]).sum();
        assert_eq!(
            inside, n,
            "{p:?}: sampled outside the candidates: {counts:?}"
        );
        // One degree of freedom: P(chi2 > 10.83) = 0.001.
        assert!(chi2 < 10.83, "{p:?}: chi2 = {chi2}, counts {counts:?}");
    }
}
