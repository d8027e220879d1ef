//! Flags of scaling out and surviving: prefix-affinity routing, hung-worker detection, and joining a
//! running gateway (flattened into `serve` and `worker`).

use std::time::Duration;

use anyhow::bail;
use clap::Args;
use gateway::router::AffinityConfig;
use worker::serve::lifecycle::{DEFAULT_LONG_STEP_TIMEOUT, Lifecycle};

/// `serve`: routing and liveness.
#[derive(Args, Debug, Clone)]
pub struct ServeScaleFlags {
    /// Name workers join by (`ringserve worker --join NAME`) [default: ringserve-PORT, PORT the
    /// bound gRPC port].
    #[arg(long)]
    pub name: Option<String>,
    /// What this server's shared-memory segment names start with (`PREFIX.PID...`). At start,
    /// `serve` removes the leftovers of dead gateways that used the same prefix, and only those:
    /// deployments (or test runs) sharing a host keep apart by giving each its own.
    #[arg(long, default_value = "ringserve")]
    pub shm_prefix: String,
    /// Seconds a live worker's heartbeat may be old before it is declared hung (killed, its
    /// requests resumed elsewhere, restarted).
    #[arg(long, default_value_t = 1.0)]
    pub heartbeat_timeout: f64,
    /// Prefix affinity: a request goes to the worker holding its prompt prefix unless that one has
    /// more than this many outstanding tokens beyond the least-loaded worker (plus the ratio below).
    #[arg(long, default_value_t = AffinityConfig::DEFAULT_SLACK_TOKENS)]
    pub affinity_slack_tokens: i64,
    /// Prefix affinity: extra slack as a fraction of the least-loaded worker's outstanding tokens.
    #[arg(long, default_value_t = AffinityConfig::DEFAULT_SLACK_RATIO)]
    pub affinity_slack_ratio: f64,
    /// Prefix blocks the router remembers (LRU); 0 turns prefix affinity off.
    #[arg(long, default_value_t = AffinityConfig::DEFAULT_MAX_ENTRIES)]
    pub affinity_max_entries: usize,
}

impl ServeScaleFlags {
    /// The affinity policy.
    pub fn affinity(&self) -> anyhow::Result<AffinityConfig> {
        if self.affinity_slack_tokens < 0
            || self.affinity_slack_ratio.is_nan()
            || self.affinity_slack_ratio < 0.0
        {
            bail!("--affinity-slack-tokens and --affinity-slack-ratio must be at least 0");
        }
        Ok(AffinityConfig {
            slack_tokens: self.affinity_slack_tokens,
            slack_ratio: self.affinity_slack_ratio,
            max_entries: self.affinity_max_entries,
        })
    }

    /// The segment-name prefix: 1 to 64 characters of `[A-Za-z0-9_-]` (no `.`, so one prefix is
    /// never the start of another's names).
    pub fn shm_prefix(&self) -> anyhow::Result<String> {
        let p = &self.shm_prefix;
        let ok = (1..=64).contains(&p.len())
            && p.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_-".contains(&b));
        if !ok {
            bail!("--shm-prefix {p:?}: use 1 to 64 characters of A-Z, a-z, 0-9, `_` and `-`");
        }
        Ok(p.clone())
    }

    /// The heartbeat limit.
    pub fn heartbeat_timeout(&self) -> anyhow::Result<Duration> {
        seconds("--heartbeat-timeout", self.heartbeat_timeout)
    }
}

/// `serve` and `worker`: the worker's own liveness.
#[derive(Args, Debug, Clone)]
pub struct WorkerLifeFlags {
    /// Seconds the worker's loop may spend in one step (or stuck) before its heartbeat stops and
    /// the gateway treats it as hung.
    #[arg(long, default_value_t = DEFAULT_LONG_STEP_TIMEOUT.as_secs_f64())]
    pub long_step_timeout: f64,
}

impl WorkerLifeFlags {
    /// The same flags as arguments of `ringserve worker`.
    pub fn to_args(&self) -> Vec<String> {
        vec![
            "--long-step-timeout".into(),
            self.long_step_timeout.to_string(),
        ]
    }

    /// The worker's lifecycle settings (its drain flag unset).
    pub fn lifecycle(&self) -> anyhow::Result<Lifecycle> {
        Ok(Lifecycle {
            long_step_timeout: seconds("--long-step-timeout", self.long_step_timeout)?,
            ..Lifecycle::default()
        })
    }
}

fn seconds(flag: &str, v: f64) -> anyhow::Result<Duration> {
    if v.is_nan() || v <= 0.0 || !v.is_finite() {
        bail!("{flag} {v}: must be a positive number of seconds");
    }
    Ok(Duration::from_secs_f64(v))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        scale: ServeScaleFlags,
        #[command(flatten)]
        life: WorkerLifeFlags,
    }

    fn parse(args: &[&str]) -> Flags {
        Flags::try_parse_from(std::iter::once("x").chain(args.iter().copied())).unwrap()
    }

    #[test]
    fn defaults_and_checks() {
        let f = parse(&[]);
        assert_eq!(f.scale.affinity().unwrap(), AffinityConfig::default());
        assert_eq!(f.scale.heartbeat_timeout().unwrap(), Duration::from_secs(1));
        assert_eq!(
            f.life.lifecycle().unwrap().long_step_timeout,
            DEFAULT_LONG_STEP_TIMEOUT
        );
        assert!(
            parse(&["--heartbeat-timeout", "0"])
                .scale
                .heartbeat_timeout()
                .is_err()
        );
        assert!(
            parse(&["--affinity-slack-ratio=-1"])
                .scale
                .affinity()
                .is_err()
        );
        let args = parse(&["--long-step-timeout", "7.5"]).life.to_args();
        let back = parse(&args.iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(
            back.life.lifecycle().unwrap().long_step_timeout,
            Duration::from_secs_f64(7.5)
        );
    }
}
