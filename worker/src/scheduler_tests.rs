//! Scheduler tests.
