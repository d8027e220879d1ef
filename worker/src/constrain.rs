//! Structured output inside the engine: the grammar state of every constrained sequence, the
//! masks for a step's draws (computed on another thread while the step's forward pass runs), and
//! the drawn tokens fed back.

use std::collections::HashMap;

use grammar::{BackgroundCompiler, Constraint, GrammarSpec, TokenMask};
use rayon::prelude::*;

use crate::kv::SeqId;
use crate::request::RequestError;

/// The grammars of the live constrained sequences.
#[derive(Debug, Default)]
pub struct Constraints {
    compiler: Option<BackgroundCompiler>,
    live: HashMap<SeqId, Constraint>,
}

impl Constraints {
    /// Lets requests carry grammars, compiled by `compiler`.
    pub fn set_compiler(&mut self, compiler: BackgroundCompiler) {
        self.compiler = Some(compiler);
    }

    /// Compiles `spec` for sequence `id` and moves it past `prior_output` (a resumed request's
    /// earlier output, which the grammar allowed when it was drawn).
    pub fn add(
        &mut self,
        id: SeqId,
        spec: &GrammarSpec,
        prior_output: &[u32],
    ) -> Result<(), RequestError> {
        let compiler = self
            .compiler
            .as_ref()
            .ok_or(RequestError::NoGrammarSupport)?;
        let mut constraint = compiler.get()?.compile(spec)?;
        for &t in prior_output {
            constraint.accept(t)?;
        }
        self.live.insert(id, constraint);
        Ok(())
    }

    /// Whether `id` is constrained.
    pub fn contains(&self, id: SeqId) -> bool {
        self.live.contains_key(&id)
    }

    /// Whether no sequence is constrained.
    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }

    /// Forgets `id` (finished or cancelled).
    pub fn remove(&mut self, id: SeqId) {
        self.live.remove(&id);
    }

    /// The mask for each of `rows` (`None` where unconstrained). A grammar that fails here (its
    /// per-step work limit, say) gets a mask of the end-of-sequence ids only, so its sequence ends
    /// instead of leaving the grammar.
    pub fn masks(&mut self, rows: &[SeqId], eos_token_ids: &[u32]) -> Vec<Option<TokenMask>> {
        let at: HashMap<SeqId, usize> = rows.iter().enumerate().map(|(i, &s)| (s, i)).collect();
        let mut work: Vec<(usize, SeqId, &mut Constraint)> = self
            .live
            .iter_mut()
            .filter_map(|(id, c)| at.get(id).map(|&i| (i, *id, c)))
            .collect();
        let compute = |(i, id, c): &mut (usize, SeqId, &mut Constraint)| {
            let mask = c.mask().unwrap_or_else(|e| {
                tracing::warn!(seq = id.0, error = %e, "grammar failed; ending the sequence");
                TokenMask::only(c.vocab_size(), eos_token_ids)
            });
            let mask = if mask.count_allowed() == 0 {
                TokenMask::only(c.vocab_size(), eos_token_ids)
            } else {
                mask
            };
            (*i, mask)
        };
        let computed: Vec<(usize, TokenMask)> = if work.len() > 1 {
            work.par_iter_mut().map(compute).collect()
        } else {
            work.iter_mut().map(compute).collect()
        };
        let mut masks = vec![None; rows.len()];
        for (i, mask) in computed {
            masks[i] = Some(mask);
        }
        masks
    }

    /// Feeds `token`, just drawn, to `id`'s grammar. Returns whether the output is now complete
    /// (the sequence must end). A token the grammar refuses also ends it.
    pub fn accept(&mut self, id: SeqId, token: u32) -> bool {
        let Some(c) = self.live.get_mut(&id) else {
            return false;
        };
        match c.accept(token) {
            Ok(()) => c.is_finished(),
            Err(e) => {
                tracing::warn!(seq = id.0, token, error = %e, "grammar refused a drawn token");
                true
            }
        }
    }
}

#[cfg(test)]
#[path = "constrain_tests.rs"]
mod tests;
