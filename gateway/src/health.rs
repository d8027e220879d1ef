//! `grpc.health.v1`, told the truth: SERVING only while at least one worker is alive with its model
//! loaded and the server is not draining; NOT_SERVING otherwise.

use std::sync::atomic::Ordering;

use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use crate::service::Shared;

/// The service name clients ask about (besides `""`, the whole server).
pub const SERVICE: &str = "ringserve.v1.Inference";

/// Updates the health service from the gateway's state.
#[derive(Clone)]
pub struct Health {
    reporter: HealthReporter,
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
        Self { reporter }
    }

    /// Recomputes the status from the live workers and the draining flag.
    pub async fn update(&self, shared: &Shared) {
        // Relaxed: a plain flag, re-read on every update.
        let serving = !shared.draining.load(Ordering::Relaxed) && shared.router.live() > 0;
        let status = if serving {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        for name in ["", SERVICE] {
            self.reporter.set_service_status(name, status).await;
        }
    }
}
