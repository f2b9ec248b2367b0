//! Restart decisions: the restart policy, capped exponential backoff with
//! jitter that resets after a stable period, and the restart-intensity
//! breaker (N restarts within T → failed). Pure logic over
//! `tokio::time::Instant`, so it is tested with a paused clock.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use crate::config::{RestartPolicy, Supervision};

/// Why a bundle stopped running.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stop {
    /// The process exited with code 0.
    Clean(String),
    /// A crash, a failed start or a failed liveness check.
    Failure(String),
}

impl Stop {
    pub fn reason(&self) -> &str {
        match self {
            Stop::Clean(r) | Stop::Failure(r) => r,
        }
    }
}

/// What to do after a stop.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Start again after `delay`; `attempt` counts consecutive restarts.
    Restart { attempt: u32, delay: Duration },
    /// The policy says no restart: stay down (`failed` after a failure,
    /// `stopped` after a clean exit).
    StayDown,
    /// The breaker tripped: too many restarts in the window.
    Tripped(String),
}

/// Restart history of one bundle.
#[derive(Debug, Default)]
pub struct RestartTracker {
    consecutive: u32,
    recent: VecDeque<Instant>,
}

impl RestartTracker {
    /// Decides after a stop. `ready_for` is how long the bundle had been
    /// ready (None when it never became ready); `jitter` is in [0, 1).
    pub fn decide(
        &mut self,
        sup: &Supervision,
        policy: RestartPolicy,
        stop: &Stop,
        ready_for: Option<Duration>,
        now: Instant,
        jitter: f64,
    ) -> Decision {
        // A crash after a stable run is not a loop (yet): restart at once,
        // and back off only if the restart itself fails.
        let after_stable_run = ready_for.is_some_and(|r| r >= sup.stable_after);
        if after_stable_run {
            self.consecutive = 0;
        }
        let restart = match (policy, stop) {
            (RestartPolicy::Always, _) => true,
            (RestartPolicy::OnFailure, Stop::Failure(_)) => true,
            (RestartPolicy::OnFailure, Stop::Clean(_)) | (RestartPolicy::Never, _) => false,
        };
        if !restart {
            return Decision::StayDown;
        }
        while self
            .recent
            .front()
            .is_some_and(|t| now.duration_since(*t) >= sup.restart_window)
        {
            self.recent.pop_front();
        }
        if self.recent.len() as u32 >= sup.max_restarts {
            return Decision::Tripped(format!(
                "crash loop: {} restarts within {}; last: {}; fix the bundle, then run `bundlevisor restart`",
                self.recent.len(),
                humantime::format_duration(sup.restart_window),
                stop.reason()
            ));
        }
        self.consecutive += 1;
        self.recent.push_back(now);
        Decision::Restart {
            attempt: self.consecutive,
            delay: if after_stable_run {
                Duration::ZERO
            } else {
                backoff(sup, self.consecutive, jitter)
            },
        }
    }

    /// An operator restart or a manifest change clears the history.
    pub fn reset(&mut self) {
        self.consecutive = 0;
        self.recent.clear();
    }
}

/// `initial * 2^(attempt-1)`, capped, then scaled by a jitter factor in
/// [0.8, 1.2) and capped again.
pub fn backoff(sup: &Supervision, attempt: u32, jitter: f64) -> Duration {
    let exp = attempt.saturating_sub(1).min(30);
    let base = sup
        .backoff_initial
        .saturating_mul(1u32 << exp)
        .min(sup.backoff_max);
    base.mul_f64(0.8 + 0.4 * jitter.clamp(0.0, 1.0))
        .min(sup.backoff_max)
}

/// Supervision settings for the unit tests of restart decisions: fast
/// backoff, a 10 s stable period, 3 restarts within 30 s.
#[cfg(test)]
pub(crate) fn test_supervision() -> Supervision {
    toml::from_str(
        "backoff_initial = \"50ms\"\nbackoff_max = \"1s\"\nstable_after = \"10s\"\nmax_restarts = 3\nrestart_window = \"30s\"",
    )
    .unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sup() -> Supervision {
        test_supervision()
    }

    fn crash() -> Stop {
        Stop::Failure("process exited (exit code 1)".into())
    }

    #[test]
    fn backoff_doubles_from_a_fast_first_restart_and_is_capped() {
        let s = sup();
        assert_eq!(backoff(&s, 1, 0.5), Duration::from_millis(50));
        assert!(backoff(&s, 1, 0.999) <= Duration::from_millis(60));
        assert!(backoff(&s, 1, 0.0) >= Duration::from_millis(40));
        assert_eq!(backoff(&s, 3, 0.5), Duration::from_millis(200));
        assert_eq!(backoff(&s, 10, 0.999), Duration::from_secs(1));
        assert_eq!(backoff(&s, u32::MAX, 0.5), Duration::from_secs(1));
    }

    #[test]
    fn policies_decide_which_stops_restart() {
        let s = sup();
        let now = Instant::now();
        let clean = Stop::Clean("exit code 0".into());
        assert!(matches!(
            RestartTracker::default().decide(&s, RestartPolicy::Always, &clean, None, now, 0.5),
            Decision::Restart { .. }
        ));
        assert_eq!(
            RestartTracker::default().decide(&s, RestartPolicy::OnFailure, &clean, None, now, 0.5),
            Decision::StayDown
        );
        assert!(matches!(
            RestartTracker::default().decide(
                &s,
                RestartPolicy::OnFailure,
                &crash(),
                None,
                now,
                0.5
            ),
            Decision::Restart { .. }
        ));
        assert_eq!(
            RestartTracker::default().decide(&s, RestartPolicy::Never, &crash(), None, now, 0.5),
            Decision::StayDown
        );
    }

    #[tokio::test(start_paused = true)]
    async fn breaker_trips_on_the_fourth_restart_within_the_window_and_resets() {
        let s = sup();
        let mut t = RestartTracker::default();
        let mut delays = Vec::new();
        for _ in 0..3 {
            match t.decide(
                &s,
                RestartPolicy::OnFailure,
                &crash(),
                None,
                Instant::now(),
                0.5,
            ) {
                Decision::Restart { delay, .. } => delays.push(delay),
                other => panic!("{other:?}"),
            }
            tokio::time::advance(Duration::from_secs(1)).await;
        }
        assert_eq!(delays, [50, 100, 200].map(Duration::from_millis));
        match t.decide(
            &s,
            RestartPolicy::OnFailure,
            &crash(),
            None,
            Instant::now(),
            0.5,
        ) {
            Decision::Tripped(reason) => assert!(
                reason.contains("3 restarts within 30s") && reason.contains("exit code 1"),
                "{reason}"
            ),
            other => panic!("{other:?}"),
        }
        t.reset();
        assert!(matches!(
            t.decide(
                &s,
                RestartPolicy::OnFailure,
                &crash(),
                None,
                Instant::now(),
                0.5
            ),
            Decision::Restart { attempt: 1, .. }
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn old_restarts_leave_the_window_and_a_stable_run_resets_the_backoff() {
        let s = sup();
        let mut t = RestartTracker::default();
        for _ in 0..3 {
            assert!(matches!(
                t.decide(
                    &s,
                    RestartPolicy::OnFailure,
                    &crash(),
                    None,
                    Instant::now(),
                    0.5
                ),
                Decision::Restart { .. }
            ));
        }
        tokio::time::advance(Duration::from_secs(31)).await;
        // Out of the window: allowed again, but still backing off (never stable).
        assert_eq!(
            t.decide(
                &s,
                RestartPolicy::OnFailure,
                &crash(),
                Some(Duration::from_secs(1)),
                Instant::now(),
                0.5
            ),
            Decision::Restart {
                attempt: 4,
                delay: Duration::from_millis(400)
            }
        );
        // Ready for longer than stable_after: restarted at once, and a
        // failing restart backs off from the start again.
        assert_eq!(
            t.decide(
                &s,
                RestartPolicy::OnFailure,
                &crash(),
                Some(Duration::from_secs(10)),
                Instant::now(),
                0.5
            ),
            Decision::Restart {
                attempt: 1,
                delay: Duration::ZERO
            }
        );
        assert_eq!(
            t.decide(
                &s,
                RestartPolicy::OnFailure,
                &crash(),
                None,
                Instant::now(),
                0.5
            ),
            Decision::Restart {
                attempt: 2,
                delay: Duration::from_millis(100)
            }
        );
    }
}
