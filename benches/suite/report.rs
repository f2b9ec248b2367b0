//! The table `make bench` prints, and the same rows as JSON.

use std::time::Duration;

use serde::Serialize;

use crate::harness::Summary;

#[derive(Debug, Clone, Copy, Serialize)]
#[serde(tag = "kind", content = "value", rename_all = "snake_case")]
pub enum Target {
    None,
    /// Median at most the floor's median plus this.
    OverFloorAtMost(Duration),
    /// Median at most this.
    AtMost(Duration),
    /// Rate at least this fraction of the floor's rate.
    RateOfFloorAtLeast(f64),
    /// At most this many KiB.
    MemoryAtMost(u64),
    /// A peer's median over the floor at least this many times ours
    /// (the second figure, µs).
    OverheadOverOursAtLeast(f64, f64),
    /// A peer's rate at most this fraction of ours (the row's second rate).
    RateOfOursAtMost(f64),
}

#[derive(Debug, Serialize)]
pub struct Row {
    pub what: String,
    pub got: Option<Summary>,
    pub floor: Option<Summary>,
    /// Operations per second: (measured, floor).
    pub rate: Option<(f64, f64)>,
    pub memory_kib: Option<u64>,
    pub target: Target,
    pub met: Option<bool>,
}

impl Row {
    pub fn latency(what: &str, got: Summary, floor: Option<Summary>) -> Row {
        Row {
            what: what.to_string(),
            got: Some(got),
            floor,
            rate: None,
            memory_kib: None,
            target: Target::None,
            met: None,
        }
    }

    pub fn memory(what: &str, kib: u64, target: Target) -> Row {
        Row {
            what: what.to_string(),
            got: None,
            floor: None,
            rate: None,
            memory_kib: Some(kib),
            target: Target::None,
            met: None,
        }
        .target(target)
    }

    /// Operations per second against another's (a floor, or ours).
    pub fn throughput(what: &str, got: f64, of: f64) -> Row {
        Row {
            what: what.to_string(),
            got: None,
            floor: None,
            rate: Some((got, of)),
            memory_kib: None,
            target: Target::None,
            met: None,
        }
    }

    pub fn rate(mut self, got: f64, floor: f64) -> Row {
        self.rate = Some((got, floor));
        let target = self.target;
        self.target(target)
    }

    pub fn target(mut self, target: Target) -> Row {
        self.target = target;
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        self.met = match target {
            Target::None => None,
            Target::OverFloorAtMost(d) => self
                .got
                .zip(self.floor)
                .map(|(g, f)| g.median_us - f.median_us <= us(d)),
            Target::AtMost(d) => self.got.map(|g| g.median_us <= us(d)),
            Target::RateOfFloorAtLeast(x) => self.rate.map(|(g, f)| g >= x * f),
            Target::MemoryAtMost(kib) => self.memory_kib.map(|m| m <= kib),
            Target::OverheadOverOursAtLeast(x, ours) => self
                .got
                .zip(self.floor)
                .map(|(g, f)| g.median_us - f.median_us >= x * ours),
            Target::RateOfOursAtMost(x) => self.rate.map(|(g, ours)| g <= x * ours),
        };
        self
    }
}

fn time(us: f64) -> String {
    if us >= 10_000.0 {
        format!("{:.1} ms", us / 1000.0)
    } else {
        format!("{us:.1} µs")
    }
}

fn ratio(x: f64) -> String {
    if x < 0.1 {
        format!("×{x:.4}")
    } else {
        format!("×{x:.2}")
    }
}

fn target_text(t: Target) -> String {
    match t {
        Target::None => String::new(),
        Target::OverFloorAtMost(d) => format!("≤ floor + {}", time(d.as_secs_f64() * 1e6)),
        Target::AtMost(d) => format!("≤ {}", time(d.as_secs_f64() * 1e6)),
        Target::RateOfFloorAtLeast(x) => format!("rate ≥ {:.0}% of floor", x * 100.0),
        Target::MemoryAtMost(kib) => format!("≤ {} MiB", kib >> 10),
        Target::OverheadOverOursAtLeast(x, ours) => {
            format!("over floor ≥ {x:.0}× ours ({})", time(ours))
        }
        Target::RateOfOursAtMost(x) => format!("rate ≤ {:.0}% of ours", x * 100.0),
    }
}

/// The table on stdout; with `json`, the rows in `target/bench/suite.json`.
pub fn print(rows: &[Row], took: Duration, json: bool) {
    println!();
    println!(
        "{:<44} {:>10} {:>10} {:>10} {:>10} {:>7} {:>17}  {:<22} met",
        "what", "median", "p99", "floor med", "floor p99", "ratio", "ops/s (floor %)", "target"
    );
    for r in rows {
        let (median, p99) = match (r.got, r.memory_kib) {
            (Some(g), _) => (time(g.median_us), time(g.p99_us)),
            (None, Some(kib)) => (format!("{:.1} MiB", kib as f64 / 1024.0), String::new()),
            (None, None) => (String::new(), String::new()),
        };
        let (floor_median, floor_p99, ratio) = match (r.got, r.floor) {
            (Some(g), Some(f)) => (
                time(f.median_us),
                time(f.p99_us),
                ratio(g.median_us / f.median_us),
            ),
            _ => (String::new(), String::new(), String::new()),
        };
        let rate = r
            .rate
            .map(|(g, f)| format!("{g:.0} ({:.0}%)", 100.0 * g / f))
            .unwrap_or_default();
        let met = match r.met {
            Some(true) => "yes",
            Some(false) => "NO",
            None => "",
        };
        println!(
            "{:<44} {median:>10} {p99:>10} {floor_median:>10} {floor_p99:>10} {ratio:>7} {rate:>17}  {:<22} {met}",
            r.what,
            target_text(r.target)
        );
    }
    println!("\n(suite ran in {:.0} s)", took.as_secs_f64());
    if !json {
        println!("smoke run (small samples, no --bench): `make bench` gives the figures");
    }
    let dir = std::path::Path::new("target/bench");
    if json && std::fs::create_dir_all(dir).is_ok() {
        let json = serde_json::to_vec_pretty(&rows).unwrap();
        if std::fs::write(dir.join("suite.json"), json).is_ok() {
            println!("rows as JSON: {}", dir.join("suite.json").display());
        }
    }
}
