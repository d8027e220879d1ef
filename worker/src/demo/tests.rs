//! Tests of the demo model and its tokenizer.

use super::tokenizer::{self, build_tokenizer};
use super::*;
use crate::backend::cpu::{CpuBackend, CpuOptions};
use crate::backend::{Backend, ForwardBatch, SeqInput};
use crate::checkpoint::Checkpoint;
use crate::config::{Architecture, RopeScaling};

#[test]
fn tokenizer_round_trips_any_text() {
    let tok = build_tokenizer().unwrap();
    let vocab = tok.get_vocab_size(true);
    // The corpus is large enough for the trainer to reach its target.
    assert_eq!(vocab, tokenizer::TARGET_VOCAB);
    for (i, special) in tokenizer::SPECIAL_TOKENS.iter().enumerate() {
        assert_eq!(tok.token_to_id(special), Some(i as u32));
    }
    let texts = [
        "The keeper climbed the stairs to light the lamp.",
        "  leading spaces, tabs\tand\nnewlines  ",
        "emoji 🦀🚀 and CJK 你好，世界 and accents: naïve café",
        "",
    ];
    for text in texts {
        let enc = tok.encode(text, false).unwrap();
        let back = tok.decode(enc.get_ids(), false).unwrap();
        assert_eq!(back, text);
    }
    // Learned merges make common English short.
    let enc = tok.encode("the lighthouse and the library", false).unwrap();
    assert!(enc.get_ids().len() <= 8, "{:?}", enc.get_tokens());
    // With special tokens, BOS comes first; special tokens in text are single ids.
    let enc = tok.encode("hi<|eot|>", true).unwrap();
    assert_eq!(enc.get_ids()[0], 0);
    assert_eq!(*enc.get_ids().last().unwrap(), 4);
}

#[test]
fn tokenizer_is_deterministic() {
    let a = build_tokenizer().unwrap().to_string(false).unwrap();
    let b = build_tokenizer().unwrap().to_string(false).unwrap();
    assert!(a == b, "two trainings differ");
}

#[test]
fn chat_template_renders() {
    let mut env = minijinja::Environment::new();
    env.add_template("chat", tokenizer::CHAT_TEMPLATE).unwrap();
    let messages = vec![
        minijinja::context! { role => "system", content => "Be brief." },
        minijinja::context! { role => "user", content => " Hello! " },
    ];
    let render = |generation: bool| {
        env.get_template("chat")
            .unwrap()
            .render(minijinja::context! {
                messages => messages.clone(),
                bos_token => tokenizer::BOS,
                add_generation_prompt => generation,
            })
            .unwrap()
    };
    let base = "<|begin_of_text|><|start_header|>system<|end_header|>\n\nBe brief.<|eot|>\
                <|start_header|>user<|end_header|>\n\nHello!<|eot|>";
    assert_eq!(render(false), base);
    assert_eq!(
        render(true),
        format!("{base}<|start_header|>assistant<|end_header|>\n\n")
    );
}

#[test]
fn demo_model_loads_runs_and_is_deterministic() {
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    write_demo_model(a.path()).unwrap();
    write_demo_model(b.path()).unwrap();
    for f in DEMO_FILES {
        let (x, y) = (
            std::fs::read(a.path().join(f)).unwrap(),
            std::fs::read(b.path().join(f)).unwrap(),
        );
        assert!(x == y, "{f} differs between two writes");
    }

    let (config, ckpt) = Checkpoint::load(a.path()).unwrap();
    assert_eq!(config.architecture, Architecture::Llama);
    assert!(config.tie_word_embeddings);
    assert!(matches!(config.rope.scaling, RopeScaling::Llama3 { .. }));
    assert_eq!(config.eos_token_ids, vec![4, 1]);
    assert_eq!(config.bos_token_id, Some(0));
    let tok = tokenizers::Tokenizer::from_file(a.path().join("tokenizer.json")).unwrap();
    assert_eq!(tok.get_vocab_size(true), config.vocab_size);

    let options = CpuOptions {
        block_size: 16,
        num_kv_blocks: 4,
        quantization: None,
        kv_cache_dtype: crate::quant::kv::KvCacheDtype::Auto,
    };
    let mut backend = CpuBackend::new(&config, &ckpt, options).unwrap();
    let ids = tok.encode("Good morning, good evening.", true).unwrap();
    let ids = ids.get_ids();
    let positions: Vec<u32> = (0..ids.len() as u32).collect();
    let table = [1u32, 2, 3];
    let seqs = [SeqInput {
        query_start: 0,
        query_len: ids.len(),
        context_len: ids.len(),
        block_table: &table,
        sample: true,
    }];
    let logits = backend
        .forward(&ForwardBatch {
            token_ids: ids,
            positions: &positions,
            seqs: &seqs,
        })
        .unwrap();
    assert_eq!((logits.rows(), logits.vocab), (1, config.vocab_size));
    let row = logits.row(0);
    assert!(row.iter().all(|v| v.is_finite()));
    let spread =
        row.iter().cloned().fold(f32::MIN, f32::max) - row.iter().cloned().fold(f32::MAX, f32::min);
    assert!(spread > 1.0, "logits are flat: spread {spread}");
}

#[test]
fn cached_dir_is_written_once_and_shared() {
    let root = tempfile::tempdir().unwrap();
    let dirs: Vec<PathBuf> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..6)
            .map(|_| s.spawn(|| cached_demo_model_dir_in(root.path()).unwrap()))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(dirs.windows(2).all(|w| w[0] == w[1]));
    let dir = &dirs[0];
    assert!(is_complete(dir));
    // No temporary folders are left behind.
    let entries: Vec<_> = std::fs::read_dir(root.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(entries.len(), 1, "{entries:?}");
    // A second call reuses the folder as it is.
    let marker = dir.join("marker");
    std::fs::write(&marker, "kept").unwrap();
    assert_eq!(&cached_demo_model_dir_in(root.path()).unwrap(), dir);
    assert!(marker.exists());
    Checkpoint::load(dir).unwrap();
}
