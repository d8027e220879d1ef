//! Launched steps (async scheduling, [`Backend::launch_sampled`](super::Backend::launch_sampled))
//! for backends that compute a step at once on the host (the null device, the test
//! `ToyBackend`): the draws wait here until collected, and a fed step reads the last launch's.

use std::collections::VecDeque;

use super::{BackendError, ForwardBatch, TokenFeed};

/// Most launched steps uncollected at once.
pub const MAX_LAUNCHED: usize = 2;

/// Checks a launch against what is in flight: fewer than [`MAX_LAUNCHED`] uncollected steps,
/// and a fed step ([`TokenFeed::PreviousStep`]) of one-token decodes that sample, one for each of
/// the `last_draws` draws of the last launched step.
pub fn check_launch(
    batch: &ForwardBatch<'_>,
    feed: TokenFeed,
    in_flight: usize,
    last_draws: usize,
) -> Result<(), BackendError> {
    if in_flight >= MAX_LAUNCHED {
        return Err(BackendError::InvalidBatch(format!(
            "a step launched with {in_flight} launched steps uncollected"
        )));
    }
    if feed == TokenFeed::PreviousStep {
        let decodes = batch
            .seqs
            .iter()
            .enumerate()
            .all(|(i, s)| s.query_len == 1 && s.query_start == i && s.sample);
        if !decodes || batch.token_ids.len() != last_draws {
            return Err(BackendError::InvalidBatch(format!(
                "a fed step of {} tokens needs one-token decodes, one per draw of the last \
                 launched step ({last_draws})",
                batch.token_ids.len()
            )));
        }
    }
    Ok(())
}

/// The draws of launched steps computed at once.
#[derive(Debug, Clone, Default)]
pub struct HostLaunches {
    launched: VecDeque<Vec<u32>>,
    last: Vec<u32>,
}

impl HostLaunches {
    /// Runs `draw` over `batch` — its token ids the last launch's draws when `feed` says so — and
    /// keeps the draws for [`HostLaunches::collect`].
    pub fn launch(
        &mut self,
        batch: &ForwardBatch<'_>,
        feed: TokenFeed,
        draw: impl FnOnce(&ForwardBatch<'_>) -> Result<Vec<u32>, BackendError>,
    ) -> Result<(), BackendError> {
        check_launch(batch, feed, self.launched.len(), self.last.len())?;
        let tokens = match feed {
            TokenFeed::Host => draw(batch)?,
            TokenFeed::PreviousStep => draw(&ForwardBatch {
                token_ids: &self.last,
                ..*batch
            })?,
        };
        self.last.clone_from(&tokens);
        self.launched.push_back(tokens);
        Ok(())
    }

    /// The oldest uncollected launch's draws.
    pub fn collect(&mut self) -> Result<Vec<u32>, BackendError> {
        self.launched
            .pop_front()
            .ok_or_else(|| BackendError::InvalidBatch("no launched step to collect".into()))
    }
}
