//! `grpc.health.v1`, told the truth: SERVING only while at least one worker takes new requests
//! (alive, its model loaded, not draining) and the server is not draining; NOT_SERVING otherwise.
//! Events (a worker ready, dead, shutdown) update it at once; [`Health::refresh`] re-checks every
//! [`REFRESH`] for changes the ring reader sees (a worker announcing its drain).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use crate::link::WorkerLink;
use crate::metrics as m;
use crate::pipeline::Shared;

/// The service name clients ask about (besides `""`, the whole server).
pub const SERVICE: &str = "ringserve.v1.Inference";

/// How often [`Health::refresh`] re-checks.
pub const REFRESH: Duration = Duration::from_millis(100);

/// Updates the health service from the gateway's state.
#[derive(Clone)]
pub struct Health {
    reporter: HealthReporter,
    /// The status last reported (watchers are told only of changes).
    last: Arc<Mutex<ServingStatus>>,
}

impl std::fmt::Debug for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Health").finish_non_exhaustive()
    }
}

impl Health {
    /// Wraps a reporter; everything starts NOT_SERVING.
    pub async fn new(reporter: HealthReporter) -> Self {
        for name in ["", SERVICE] {
            reporter
                .set_service_status(name, ServingStatus::NotServing)
                .await;
        }
        Self {
            reporter,
            last: Arc::new(Mutex::new(ServingStatus::NotServing)),
        }
    }

    /// Puts `link` into the router's slot `slot` (or, with `None`, takes the slot out of
    /// rotation), then updates the status and the live-workers gauge.
    pub async fn set_worker(&self, shared: &Shared, slot: usize, link: Option<Arc<WorkerLink>>) {
        shared.router.set(slot, link);
        self.update(shared).await;
        metrics::gauge!(m::WORKERS_LIVE).set(shared.router.live() as f64);
    }

    /// Recomputes the status from the workers that take requests and the draining flag.
    pub async fn update(&self, shared: &Shared) {
        // Relaxed: a plain flag, re-read on every update.
        let serving = !shared.draining.load(Ordering::Relaxed) && shared.router.any().is_some();
        let status = if serving {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        {
            // The status is a plain value: a panic elsewhere cannot leave it inconsistent.
            let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
            if *last == status {
                return;
            }
            *last = status;
        }
        for name in ["", SERVICE] {
            self.reporter.set_service_status(name, status).await;
        }
    }

    /// Re-checks every [`REFRESH`] until `stop` turns true.
    pub async fn refresh(self, shared: Arc<Shared>, mut stop: tokio::sync::watch::Receiver<bool>) {
        loop {
            tokio::select! {
                () = tokio::time::sleep(REFRESH) => self.update(&shared).await,
                _ = stop.changed() => return,
            }
        }
    }
}
