//! Wall-clock time as stored and compared in the state database.

/// Seconds since the Unix epoch (0 if the clock is before it).
pub fn unix_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}
