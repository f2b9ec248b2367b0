//! Token bucket per (workspace, bundle), shared by read and list.

use std::time::Duration;

use tokio::time::Instant;

#[derive(Debug, Clone)]
pub struct TokenBucket {
    tokens: f64,
    last: Instant,
    rate: f64,
    burst: f64,
}

impl TokenBucket {
    /// A full bucket: `burst` requests at once, refilled at `rate` per second.
    pub fn new(rate: f64, burst: u32, now: Instant) -> Self {
        TokenBucket {
            tokens: burst as f64,
            last: now,
            rate,
            burst: burst as f64,
        }
    }

    /// Takes one token, or says after how many milliseconds one will be there:
    /// `ceil((1 - tokens) / rate * 1000)`.
    pub fn take(&mut self, now: Instant) -> Result<(), u64> {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        self.last = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(((1.0 - self.tokens) / self.rate * 1000.0).ceil() as u64)
        }
    }
}

/// How long until a rate-limited caller may retry, as a Duration.
pub fn retry_after(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn burst_then_refill_at_the_rate_with_the_contract_retry_after() {
        let mut b = TokenBucket::new(100.0, 3, Instant::now());
        for _ in 0..3 {
            b.take(Instant::now()).unwrap();
        }
        // Empty: one token takes 1/100 s.
        assert_eq!(b.take(Instant::now()), Err(10));
        tokio::time::advance(Duration::from_millis(4)).await;
        // 0.4 tokens: ceil(0.6 / 100 * 1000) = 6 ms.
        assert_eq!(b.take(Instant::now()), Err(6));
        tokio::time::advance(retry_after(6)).await;
        assert_eq!(b.take(Instant::now()), Ok(()));
        // Refill never exceeds the burst.
        tokio::time::advance(Duration::from_secs(60)).await;
        for _ in 0..3 {
            b.take(Instant::now()).unwrap();
        }
        assert!(b.take(Instant::now()).is_err());
    }
}
