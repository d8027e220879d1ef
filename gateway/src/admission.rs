//! Admission control: a bound on requests in flight and on prompt tokens not yet prefilled.
//!
//! A request is admitted only if both bounds hold after adding it; otherwise it is refused at once
//! (`RESOURCE_EXHAUSTED`), so the gateway's queues stay bounded and every admitted request finishes.
//! A request larger than the whole token bound is admitted when nothing else is queued, so it cannot
//! starve.
//!
//! A request stays in flight until its worker is done with it *and* its client has read (or dropped)
//! the response stream: tokens the client has not read yet are held by the gateway, so they count.
//! The request's task and its response stream each hold a share of one [`Permit`].

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// The bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdmissionLimits {
    /// Requests admitted and not yet finished.
    pub max_in_flight: usize,
    /// Prompt tokens of admitted requests whose first token has not arrived yet.
    pub max_queued_prompt_tokens: usize,
}

#[derive(Debug, Default)]
struct Counts {
    in_flight: usize,
    queued_tokens: usize,
}

/// Shared admission state.
#[derive(Debug, Clone)]
pub struct Admission {
    limits: AdmissionLimits,
    counts: Arc<Mutex<Counts>>,
}

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("too many requests in flight (limit {limit}); retry later")]
    InFlight { limit: usize },
    #[error(
        "too many prompt tokens queued ({queued} + {prompt} over the limit of {limit}); retry later"
    )]
    QueuedTokens {
        queued: usize,
        prompt: usize,
        limit: usize,
    },
}

impl Admission {
    /// Admission with these bounds.
    pub fn new(limits: AdmissionLimits) -> Self {
        Self {
            limits,
            counts: Arc::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Counts> {
        // The counters are plain integers: a panic elsewhere cannot leave them inconsistent.
        self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Admits a request with `prompt_tokens` tokens, or says why not.
    pub fn try_admit(&self, prompt_tokens: usize) -> Result<Permit, Refused> {
        let mut c = self.lock();
        if c.in_flight >= self.limits.max_in_flight {
            return Err(Refused::InFlight {
                limit: self.limits.max_in_flight,
            });
        }
        if c.queued_tokens > 0
            && c.queued_tokens + prompt_tokens > self.limits.max_queued_prompt_tokens
        {
            return Err(Refused::QueuedTokens {
                queued: c.queued_tokens,
                prompt: prompt_tokens,
                limit: self.limits.max_queued_prompt_tokens,
            });
        }
        c.in_flight += 1;
        c.queued_tokens += prompt_tokens;
        Ok(Permit {
            held: Arc::new(Held {
                admission: self.clone(),
                queued: AtomicUsize::new(prompt_tokens),
            }),
        })
    }

    /// Requests in flight now.
    pub fn in_flight(&self) -> usize {
        self.lock().in_flight
    }

    /// Prompt tokens queued now.
    pub fn queued_prompt_tokens(&self) -> usize {
        self.lock().queued_tokens
    }
}

/// An admitted request's share of the bounds. Shares made with [`Permit::share`] hold the same
/// admission; it is returned when the last share is dropped.
#[derive(Debug)]
pub struct Permit {
    held: Arc<Held>,
}

#[derive(Debug)]
struct Held {
    admission: Admission,
    /// Prompt tokens still counted as queued (0 once prefilled).
    queued: AtomicUsize,
}

impl Permit {
    /// Another share of the same admission.
    pub fn share(&self) -> Permit {
        Permit {
            held: Arc::clone(&self.held),
        }
    }

    /// The request's prompt has been prefilled (its first token arrived): release its queued tokens.
    pub fn prefilled(&self) {
        // Relaxed: the swap only decides which caller returns the tokens; the counts are under the lock.
        let queued = self.held.queued.swap(0, Ordering::Relaxed);
        if queued > 0 {
            self.held.admission.lock().queued_tokens -= queued;
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut c = self.admission.lock();
        c.queued_tokens -= *self.queued.get_mut();
        c.in_flight -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn adm(reqs: usize, toks: usize) -> Admission {
        Admission::new(AdmissionLimits {
            max_in_flight: reqs,
            max_queued_prompt_tokens: toks,
        })
    }

    #[test]
    fn in_flight_bound_and_release() {
        let a = adm(2, 1000);
        let p1 = a.try_admit(10).unwrap();
        let _p2 = a.try_admit(10).unwrap();
        assert_eq!(a.try_admit(1).unwrap_err(), Refused::InFlight { limit: 2 });
        drop(p1);
        assert!(a.try_admit(1).is_ok());
    }

    #[test]
    fn queued_tokens_bound_released_by_prefill() {
        let a = adm(10, 100);
        let p1 = a.try_admit(80).unwrap();
        assert!(matches!(
            a.try_admit(30),
            Err(Refused::QueuedTokens { queued: 80, .. })
        ));
        p1.prefilled();
        assert_eq!(a.queued_prompt_tokens(), 0);
        let _p2 = a.try_admit(30).unwrap();
        drop(p1);
        assert_eq!(a.in_flight(), 1);
        assert_eq!(a.queued_prompt_tokens(), 30);
    }

    #[test]
    fn admission_is_returned_when_the_last_share_drops() {
        let a = adm(1, 100);
        let task = a.try_admit(10).unwrap();
        let stream = task.share();
        drop(task);
        assert_eq!(a.try_admit(1).unwrap_err(), Refused::InFlight { limit: 1 });
        stream.prefilled();
        assert_eq!(a.queued_prompt_tokens(), 0);
        drop(stream);
        assert_eq!((a.in_flight(), a.queued_prompt_tokens()), (0, 0));
    }

    #[test]
    fn an_oversized_prompt_is_admitted_alone() {
        let a = adm(10, 100);
        let p = a.try_admit(500).unwrap();
        assert!(a.try_admit(1).is_err());
        drop(p);
        assert_eq!((a.in_flight(), a.queued_prompt_tokens()), (0, 0));
    }
}
