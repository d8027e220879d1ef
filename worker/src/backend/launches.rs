//! Launched steps (async scheduling, [`Backend::launch_sampled`](super::Backend::launch_sampled))
//! for backends that compute a step at once on the host (the null device, the test
//! `ToyBackend`): the draws wait here until collected, and a fed step reads the last launch's.

use std::collections::VecDeque;

use super::{BackendError, ForwardBatch, TokenFeed};

/// Most launched steps uncollected at once.
pub const MAX_LAUNCHED: usize = 2;

/// Checks a launch against what is in flight: fewer than [`MAX_LAUNCHED`] uncollected steps,
/// and for a fed step ([`TokenFeed::PreviousStep`]), a one-token decode that samples for each
/// fed sequence and draw indices that rise strictly below the last launched step's
/// `last_draws`.
pub fn check_launch(
    batch: &ForwardBatch<'_>,
    feed: TokenFeed<'_>,
    in_flight: usize,
    last_draws: usize,
) -> Result<(), BackendError> {
    if in_flight >= MAX_LAUNCHED {
        return Err(BackendError::InvalidBatch(format!(
            "a step launched with {in_flight} launched steps uncollected"
        )));
    }
    if let TokenFeed::PreviousStep(draws) = feed {
        let decodes = draws.len() <= batch.seqs.len()
            && batch.seqs[..draws.len()]
                .iter()
                .enumerate()
                .all(|(i, s)| s.query_len == 1 && s.query_start == i && s.sample);
        let rising = draws.windows(2).all(|w| w[0] < w[1])
            && draws.last().is_none_or(|&d| (d as usize) < last_draws);
        if !decodes || !rising {
            return Err(BackendError::InvalidBatch(format!(
                "a step fed {} draws needs a one-token decode that samples for each, and draw \
                 indices rising below the last launched step's {last_draws}",
                draws.len()
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
        feed: TokenFeed<'_>,
        draw: impl FnOnce(&ForwardBatch<'_>) -> Result<Vec<u32>, BackendError>,
    ) -> Result<(), BackendError> {
        check_launch(batch, feed, self.launched.len(), self.last.len())?;
        let tokens = match feed {
            TokenFeed::Host => draw(batch)?,
            TokenFeed::PreviousStep(draws) => {
                let mut ids = batch.token_ids.to_vec();
                for (id, &d) in ids.iter_mut().zip(draws) {
                    *id = self.last[d as usize];
                }
                draw(&ForwardBatch {
                    token_ids: &ids,
                    ..*batch
                })?
            }
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
