//! The demo model's tokenizer: byte-level BPE trained (deterministically) on English text shipped in
//! `worker/assets/demo_corpus.txt`. Byte level means every UTF-8 string — emoji, CJK — round-trips.

use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
use tokenizers::models::{ModelWrapper, TrainerWrapper};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::processors::sequence::Sequence;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{
    AddedToken, DecoderWrapper, NormalizerWrapper, PostProcessorWrapper, PreTokenizerWrapper,
    Tokenizer, TokenizerBuilder,
};

use super::DemoError;

/// The text the BPE merges are learned from.
pub const CORPUS: &str = include_str!("../../assets/demo_corpus.txt");

/// Beginning of a text; prepended when encoding with special tokens, and by the chat template.
pub const BOS: &str = "<|begin_of_text|>";
/// End of a whole text.
pub const END_OF_TEXT: &str = "<|end_of_text|>";
/// Opens a chat turn's role header.
pub const START_HEADER: &str = "<|start_header|>";
/// Closes a chat turn's role header.
pub const END_HEADER: &str = "<|end_header|>";
/// End of a chat turn.
pub const EOT: &str = "<|eot|>";

/// Special tokens, in id order (ids 0..5).
pub const SPECIAL_TOKENS: [&str; 5] = [BOS, END_OF_TEXT, START_HEADER, END_HEADER, EOT];

/// Vocabulary the trainer aims for (it stops early when the corpus runs out of pairs).
pub const TARGET_VOCAB: usize = 2048;

/// The chat template (Jinja, as HF's `apply_chat_template` and minijinja render it). It emits the BOS
/// token itself, so its output is encoded without adding special tokens.
pub const CHAT_TEMPLATE: &str = "{{- bos_token }}\
{%- for message in messages %}\
{{- '<|start_header|>' ~ message['role'] ~ '<|end_header|>\\n\\n' ~ (message['content'] | trim) ~ '<|eot|>' }}\
{%- endfor %}\
{%- if add_generation_prompt %}\
{{- '<|start_header|>assistant<|end_header|>\\n\\n' }}\
{%- endif %}";

fn tok_err(e: impl std::fmt::Display) -> DemoError {
    DemoError::Tokenizer(e.to_string())
}

/// Trains the demo tokenizer. Deterministic: the trainer breaks ties by pair ids.
pub fn build_tokenizer() -> Result<Tokenizer, DemoError> {
    let specials: Vec<AddedToken> = SPECIAL_TOKENS
        .iter()
        .map(|t| AddedToken::from(*t, true))
        .collect();
    let mut trainer: TrainerWrapper = BpeTrainerBuilder::new()
        .vocab_size(TARGET_VOCAB)
        .min_frequency(1)
        .show_progress(false)
        .special_tokens(specials)
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build()
        .into();
    let byte_level = ByteLevel::new(false, true, true);
    let bos_template = TemplateProcessing::builder()
        .try_single(format!("{BOS} $A"))
        .map_err(tok_err)?
        .try_pair(format!("{BOS} $A {BOS} $B:1"))
        .map_err(tok_err)?
        .special_tokens(vec![(BOS, 0)])
        .build()
        .map_err(tok_err)?;
    let post = Sequence::new(vec![
        ByteLevel::new(false, false, true).into(),
        bos_template.into(),
    ]);
    let mut tokenizer = TokenizerBuilder::<
        ModelWrapper,
        NormalizerWrapper,
        PreTokenizerWrapper,
        PostProcessorWrapper,
        DecoderWrapper,
    >::new()
    .with_model(ModelWrapper::from(BPE::default()))
    .with_normalizer(None)
    .with_pre_tokenizer(Some(byte_level.into()))
    .with_post_processor(Some(post.into()))
    .with_decoder(Some(byte_level.into()))
    .build()
    .map_err(tok_err)?;
    tokenizer
        .train(&mut trainer, CORPUS.split("\n\n"))
        .map_err(tok_err)?;
    Ok(Tokenizer::from(tokenizer))
}
