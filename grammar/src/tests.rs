use super::*;
use crate::testing::byte_tokenizer;

const EOS: u32 = 256;

fn compiler() -> Compiler {
    Compiler::new(&byte_tokenizer(), 260, &[EOS, 258]).expect("compiler")
}

/// Feeds `text` byte by byte, checking the mask allowed each byte; returns the constraint.
fn feed(c: &mut Constraint, text: &str) -> Result<(), String> {
    for &b in text.as_bytes() {
        let mask = c.mask().map_err(|e| e.to_string())?;
        if !mask.allows(u32::from(b)) {
            return Err(format!("byte {:?} not allowed", b as char));
        }
        c.accept(u32::from(b)).map_err(|e| e.to_string())?;
    }
    Ok(())
}

#[test]
fn byte_tokens_and_the_special_marker() {
    let words = token_bytes(&byte_tokenizer(), 260);
    assert_eq!(words.len(), 260);
    assert_eq!(words[usize::from(b' ')], b" ");
    assert_eq!(words[0xE9], [0xE9]);
    assert_eq!(words[256][0], TokTrie::SPECIAL_TOKEN_MARKER);
    assert!(
        words[257].is_empty(),
        "ids the tokenizer lacks have no bytes"
    );
    assert_eq!(VocabStyle::of(&byte_tokenizer()), VocabStyle::ByteLevel);
}

#[test]
fn schema_output_is_accepted_and_finishes_with_eos_allowed() {
    let schema = r#"{"type":"object","properties":{"n":{"type":"integer"},"ok":{"type":"boolean"}},
        "required":["n","ok"],"additionalProperties":false}"#;
    let mut c = compiler()
        .compile(&GrammarSpec::JsonSchema(schema.into()))
        .unwrap();
    feed(&mut c, r#"{"n": 42, "ok": true"#).unwrap();
    assert!(
        !c.mask().unwrap().allows(u32::from(b' ')),
        "no free whitespace"
    );
    assert!(!c.is_finished());
    feed(&mut c, "}").unwrap();
    assert!(c.is_finished(), "nothing can follow the closing brace");
    let mask = c.mask().unwrap();
    assert!(
        mask.allows(EOS) && mask.allows(258),
        "every EOS id once complete"
    );
    assert_eq!(mask.count_allowed(), 2);
    c.accept(258).unwrap();
}

#[test]
fn schema_rejects_what_it_does_not_allow() {
    let schema =
        r#"{"type":"object","properties":{"color":{"enum":["red","green"]}},"required":["color"]}"#;
    let compiler = compiler();
    let mut c = compiler
        .compile(&GrammarSpec::JsonSchema(schema.into()))
        .unwrap();
    assert!(feed(&mut c, r#"{"color": "blue"}"#).is_err());
    let mut c = compiler
        .compile(&GrammarSpec::JsonSchema(schema.into()))
        .unwrap();
    feed(&mut c, r#"{"color": "green"}"#).unwrap();
    let mask = c.mask().unwrap();
    assert!(!mask.allows(EOS) || mask.allows(u32::from(b'}')) || c.is_finished());
}

#[test]
fn eos_is_not_allowed_before_the_output_is_complete() {
    let mut c = compiler().compile(&GrammarSpec::JsonObject).unwrap();
    feed(&mut c, r#"{"a": "#).unwrap();
    let mask = c.mask().unwrap();
    assert!(!mask.allows(EOS) && !mask.allows(258));
    assert!(mask.allows(u32::from(b'"')) && mask.allows(u32::from(b'[')));
}

#[test]
fn regex_and_choice() {
    let compiler = compiler();
    let mut c = compiler
        .compile(&GrammarSpec::Regex("[0-9]{3}-[a-z]+".into()))
        .unwrap();
    feed(&mut c, "123-ab").unwrap();
    assert!(c.mask().unwrap().allows(EOS));
    let mut c = compiler
        .compile(&GrammarSpec::Regex("[0-9]{3}".into()))
        .unwrap();
    assert!(feed(&mut c, "12a").is_err());

    let spec = GrammarSpec::Choice(vec!["a.b".into(), "c|d".into()]);
    let mut c = compiler.compile(&spec).unwrap();
    assert!(feed(&mut c, "axb").is_err(), "the dot is literal");
    let mut c = compiler.compile(&spec).unwrap();
    feed(&mut c, "c|d").unwrap();
    assert!(c.is_finished() || c.mask().unwrap().allows(EOS));
}

#[test]
fn unsupported_input_is_a_typed_error() {
    let compiler = compiler();
    let bad = |spec: GrammarSpec| compiler.compile(&spec).err().map(|e| e.to_string());
    assert!(
        bad(GrammarSpec::JsonSchema("{not json".into()))
            .unwrap()
            .contains("not JSON")
    );
    assert!(
        bad(GrammarSpec::JsonSchema("[1]".into()))
            .unwrap()
            .contains("object or a boolean")
    );
    assert!(bad(GrammarSpec::JsonSchema(r#"{"type":"frobnicate"}"#.into())).is_some());
    assert!(bad(GrammarSpec::Regex("(unclosed".into())).is_some());
    assert_eq!(
        compiler.compile(&GrammarSpec::Choice(vec![])).err(),
        Some(GrammarError::BadChoices)
    );
    let huge = GrammarSpec::Regex("a".repeat(MAX_GRAMMAR_BYTES + 1));
    assert!(matches!(
        compiler.compile(&huge),
        Err(GrammarError::TooLarge { .. })
    ));
    assert!(Compiler::new(&byte_tokenizer(), 260, &[]).is_err());
    assert!(Compiler::new(&byte_tokenizer(), 260, &[9999]).is_err());
}

#[test]
fn wire_form_round_trips() {
    for spec in [
        GrammarSpec::JsonObject,
        GrammarSpec::JsonSchema(r#"{"type":"string"}"#.into()),
        GrammarSpec::Regex("a+".into()),
        GrammarSpec::Choice(vec!["x".into(), "y\"z".into()]),
    ] {
        let back = GrammarSpec::from_wire(spec.wire_kind(), &spec.wire_text()).unwrap();
        assert_eq!(back, spec);
    }
    assert!(GrammarSpec::from_wire(0, "").is_err());
    assert!(GrammarSpec::from_wire(99, "").is_err());
    assert!(GrammarSpec::from_wire(4, "not json").is_err());
}

#[test]
fn masks_cover_model_ids_beyond_the_tokenizer() {
    let mut c = compiler().compile(&GrammarSpec::JsonObject).unwrap();
    let mask = c.mask().unwrap();
    assert_eq!(mask.len(), 260);
    assert_eq!(mask.words().len(), 9);
    assert!(!mask.allows(257) && !mask.allows(259) && !mask.allows(10_000));
    assert!(mask.count_allowed() >= 1);
}

proptest::proptest! {
    /// Random bytes never make the compiler or the matcher panic; whatever the mask allows is accepted.
    #[test]
    fn masked_walks_never_fail(picks in proptest::collection::vec(0usize..1000, 0..40)) {
        let schema = r#"{"type":"object","properties":{"xs":{"type":"array","items":{"type":"integer"},"maxItems":3},
            "s":{"type":"string","maxLength":4}},"required":["xs"]}"#;
        let mut c = compiler().compile(&GrammarSpec::JsonSchema(schema.into())).unwrap();
        for p in picks {
            if c.is_finished() {
                break;
            }
            let mask = c.mask().unwrap();
            let allowed: Vec<u32> = (0..260).filter(|&t| mask.allows(t)).collect();
            proptest::prop_assert!(!allowed.is_empty());
            c.accept(allowed[p % allowed.len()]).unwrap();
        }
    }
}

#[test]
fn structured_outputs_object() {
    use serde_json::json;
    let spec = |v| GrammarSpec::from_structured_outputs(&v);
    assert_eq!(
        spec(json!({"json": {"type": "string"}})),
        Ok(GrammarSpec::JsonSchema(r#"{"type":"string"}"#.into()))
    );
    assert_eq!(
        spec(json!({"json": "{\"type\": \"string\"}"})),
        Ok(GrammarSpec::JsonSchema(r#"{"type": "string"}"#.into()))
    );
    assert_eq!(
        spec(json!({"regex": "a+"})),
        Ok(GrammarSpec::Regex("a+".into()))
    );
    assert_eq!(
        spec(json!({"choice": ["x", "y"], "regex": null})),
        Ok(GrammarSpec::Choice(vec!["x".into(), "y".into()]))
    );
    assert_eq!(
        spec(json!({"json_object": true})),
        Ok(GrammarSpec::JsonObject)
    );
    assert!(
        spec(json!({"grammar": "root ::= x"}))
            .unwrap_err()
            .contains("structured_outputs.grammar")
    );
    assert!(
        spec(json!({"regex": "a", "choice": ["b"]}))
            .unwrap_err()
            .contains("exactly one")
    );
    assert!(spec(json!({})).unwrap_err().contains("names no constraint"));
    assert!(
        spec(json!({"choice": [1]}))
            .unwrap_err()
            .contains("list of strings")
    );
    assert!(
        spec(json!("json"))
            .unwrap_err()
            .contains("must be an object")
    );
}
