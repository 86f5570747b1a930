//! Sampled detail (`ZCTA_SAMPLE=ON/EVERY`): the full view of an op — its GPU side
//! through CUPTI and NCCL's profiler events — only for ops called in windows of ON out
//! of every EVERY; host rows (`ops`, `calls`, `comms`) for every op, always. An op
//! called outside the windows has its GPU columns NULL (not measured), never a guess.
//!
//! What the windows switch: CUPTI's activity kinds (its kernel records cost ≈ 0.46 µs
//! per kernel the program launches on Hopper), the marking of NCCL calls (without it
//! the launch callback ignores the call and nothing is joined to the op), NCCL's
//! profiler events (its event mask) and so the writer's join. CUPTI's launch callbacks
//! stay on: switched off and on under load on the 2×H200, they left CUPTI's kernel
//! records with the correlation id of other calls, while switching the kinds alone
//! did not (docs/dev/cupti.md, "Switching CUPTI").
//!
//! Windows are aligned to CLOCK_REALTIME: an op is sampled when its call starts at a
//! time `t` with `t mod EVERY < ON` (the shim checks each call's own timestamp; for
//! ops in a group, that of the ncclGroupEnd that launches them), so
//! every rank of a job samples the same ops and the cross-rank phases (barrier) stay
//! measurable for them (when the ranks call it within one window of each other; hosts
//! that run ahead of their GPUs by different amounts do not: docs/phases.md). The
//! writer thread switches the kinds and NCCL's events on [`OPEN_LEAD`] before a
//! window (it switches within its poll interval, so the window's first calls find them
//! on), and off after it in two steps: first calls stop being marked
//! ([`Detail::Draining`]), then, once the GPU records of every launch noted in the
//! window have arrived and every call marked in it has returned (the writer asks
//! CUPTI for a flush on each of its wake-ups meanwhile, at most every 10 ms; at least
//! [`MIN_DRAIN`], at most the GPU hold `ZCTA_GPU_HOLD_MS` and half the closed time
//! before the next window's lead), the kinds and NCCL's events go off
//! ([`Detail::Off`]), so no record or proxy event of the window's ops is cut short.
//! A marked call that launches only after that (it outlived the drain, like a
//! communicator's first call setting up connections) is counted as not sampled; an op
//! whose GPU work ends after that is written with `engine = none`, as one whose GPU
//! work ends after the hold.

use std::time::Duration;

/// How long before a window starts the writer switches the kinds and NCCL's events on.
pub const OPEN_LEAD: Duration = Duration::from_millis(50);
/// Shortest window; also the shortest drain (calls marked just before the window
/// closed must have launched by then).
pub const MIN_DRAIN: Duration = Duration::from_millis(50);
const MIN_ON: Duration = MIN_DRAIN;
const MAX_EVERY: Duration = Duration::from_secs(24 * 3600);

/// `ZCTA_SAMPLE`: detail for `on` out of every `every`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sampling {
    pub on: Duration,
    pub every: Duration,
}

impl Sampling {
    /// Whether a window is open at `t_ns` (CLOCK_REALTIME ns).
    pub fn in_window(&self, t_ns: i64) -> bool {
        in_window(t_ns, self.on.as_nanos() as i64, self.every.as_nanos() as i64)
    }

    /// For `process.gpu_sampling`.
    pub fn describe(&self) -> String {
        format!(
            "{} ms of every {} ms (windows aligned to CLOCK_REALTIME)",
            self.on.as_millis(),
            self.every.as_millis()
        )
    }
}

/// Whether `t_ns mod every_ns < on_ns` (the shim's hot path keeps the two numbers in
/// atomics; `every_ns` 0: no sampling, always open).
#[inline]
pub fn in_window(t_ns: i64, on_ns: i64, every_ns: i64) -> bool {
    every_ns <= 0 || t_ns.rem_euclid(every_ns) < on_ns
}

/// Parses `ZCTA_SAMPLE`: `ON/EVERY` with units (`ms`, `s`, `min`), e.g. `1s/10s`,
/// `200ms/5s`; `all` or empty: every op in full (`None`).
pub fn parse_sampling(value: &str) -> Result<Option<Sampling>, String> {
    let v = value.trim();
    if v.is_empty() || v.eq_ignore_ascii_case("all") {
        return Ok(None);
    }
    let (on, every) = v
        .split_once('/')
        .ok_or_else(|| format!("{v:?} is not ON/EVERY (e.g. 1s/10s) or all"))?;
    let (on, every) = (parse_duration(on)?, parse_duration(every)?);
    if on < MIN_ON {
        return Err(format!("window {on:?} is shorter than {MIN_ON:?}"));
    }
    if every > MAX_EVERY {
        return Err(format!("period {every:?} is longer than 24 h"));
    }
    if on + OPEN_LEAD + 2 * MIN_DRAIN > every {
        return Err(format!(
            "window {on:?} leaves less than {:?} of its period {every:?} closed (for every op: all)",
            OPEN_LEAD + 2 * MIN_DRAIN
        ));
    }
    Ok(Some(Sampling { on, every }))
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a whole number with a unit (ms, s, min)"))?;
    let ms = match unit.trim() {
        "ms" => Some(n),
        "s" => n.checked_mul(1_000),
        "min" => n.checked_mul(60_000),
        "" => return Err(format!("{s:?} needs a unit (ms, s, min)")),
        u => return Err(format!("{s:?}: unknown unit {u:?} (ms, s, min)")),
    };
    ms.map(Duration::from_millis)
        .ok_or_else(|| format!("{s:?} is too long"))
}

/// What runs now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Detail {
    /// NCCL calls (in the window) are marked for GPU capture; CUPTI's kinds and
    /// NCCL's profiler events are on.
    Full,
    /// The window closed: calls are no longer marked (new ops are not sampled); the
    /// kinds and NCCL's events stay on until what was launched in the window arrived.
    Draining,
    /// Host records and CUPTI's launch callbacks only.
    Off,
}

/// The window schedule as a state machine, driven by the writer thread.
#[derive(Debug)]
pub struct Sampler {
    cfg: Sampling,
    state: Detail,
    drain_since: i64,
    max_drain_ns: i64,
}

impl Sampler {
    /// Starts in [`Detail::Full`] (the first step closes it when outside a window);
    /// a drain lasts at most `max_drain` (the GPU hold) and at most half the time
    /// from the window's end to the next one's lead, so capture does go off between
    /// windows.
    pub fn new(cfg: Sampling, max_drain: Duration) -> Self {
        let gap = cfg.every.saturating_sub(cfg.on + OPEN_LEAD) / 2;
        Self {
            cfg,
            state: Detail::Full,
            drain_since: 0,
            max_drain_ns: max_drain.min(gap).max(MIN_DRAIN).as_nanos() as i64,
        }
    }

    pub fn state(&self) -> Detail {
        self.state
    }

    pub fn sampling(&self) -> Sampling {
        self.cfg
    }

    /// One step at `now` (CLOCK_REALTIME ns). `pending`: launches noted while calls
    /// were marked whose GPU records have not arrived (after a flush this pump), plus
    /// marked calls that have not returned yet.
    /// Returns the new state when it changed.
    pub fn step(&mut self, now: i64, pending: usize) -> Option<Detail> {
        let lead = OPEN_LEAD.as_nanos() as i64;
        let open = self.cfg.in_window(now) || self.cfg.in_window(now + lead);
        let next = match self.state {
            Detail::Full if !open => {
                self.drain_since = now;
                Detail::Draining
            }
            Detail::Draining if open => Detail::Full,
            Detail::Draining => {
                let waited = now - self.drain_since;
                let min = MIN_DRAIN.as_nanos() as i64;
                if (waited >= min && pending == 0) || waited >= self.max_drain_ns {
                    Detail::Off
                } else {
                    Detail::Draining
                }
            }
            Detail::Off if open => Detail::Full,
            s => s,
        };
        (next != self.state).then(|| {
            self.state = next;
            next
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: i64 = 1_000_000;

    #[test]
    fn parses_windows_and_rejects_nonsense() {
        let s = |on, every| {
            Some(Sampling {
                on: Duration::from_millis(on),
                every: Duration::from_millis(every),
            })
        };
        assert_eq!(parse_sampling("1s/10s"), Ok(s(1_000, 10_000)));
        assert_eq!(parse_sampling(" 200ms / 5s "), Ok(s(200, 5_000)));
        assert_eq!(parse_sampling("2s/1min"), Ok(s(2_000, 60_000)));
        // bench/knob_settings.sh's between-windows: one 50 ms window a day.
        assert_eq!(parse_sampling("50ms/1440min"), Ok(s(50, 86_400_000)));
        assert_eq!(parse_sampling("all"), Ok(None));
        assert_eq!(parse_sampling(""), Ok(None));
        for bad in [
            "1s",
            "10",
            "1/10",
            "1s/10h",
            "x/10s",
            "10ms/1s",
            "50ms/199ms",
            "5s/5s",
            "6s/5s",
            "1s/2d",
            "-1s/10s",
            "1s/25000min",
        ] {
            let e = parse_sampling(bad).expect_err(bad);
            assert!(!e.is_empty(), "{bad}");
        }
        assert!(parse_sampling("1s").unwrap_err().contains("ON/EVERY"));
        assert!(parse_sampling("1/10s").unwrap_err().contains("needs a unit"));
    }

    #[test]
    fn windows_are_aligned_to_the_clock() {
        let s = parse_sampling("100ms/1s").unwrap().unwrap();
        let base = 1_700_000_000_000 * MS; // a whole second
        assert!(s.in_window(base));
        assert!(s.in_window(base + 99 * MS));
        assert!(!s.in_window(base + 100 * MS));
        assert!(!s.in_window(base + 999 * MS));
        assert!(s.in_window(base + 1_000 * MS));
        assert!(s.describe().starts_with("100 ms of every 1000 ms"));
    }

    #[test]
    fn a_window_closes_only_once_its_launches_arrived() {
        let cfg = parse_sampling("100ms/1s").unwrap().unwrap();
        let mut s = Sampler::new(cfg, Duration::from_millis(1000));
        let t0 = 1_700_000_000_000 * MS;
        assert_eq!(s.step(t0 + 10 * MS, 0), None);
        assert_eq!(s.state(), Detail::Full);
        assert!(in_window(t0 + 10 * MS, 100 * MS, 1_000 * MS) && in_window(t0 + 500 * MS, 100 * MS, 0));
        // The window ends: calls stop being marked, the rest stays on.
        assert_eq!(s.step(t0 + 101 * MS, 3), Some(Detail::Draining));
        // Not before MIN_DRAIN, even with nothing pending.
        assert_eq!(s.step(t0 + 120 * MS, 0), None);
        // Launches still pending: keep draining.
        assert_eq!(s.step(t0 + 160 * MS, 2), None);
        assert_eq!(s.step(t0 + 170 * MS, 0), Some(Detail::Off));
        assert_eq!(s.step(t0 + 500 * MS, 0), None);
        // Capture goes on OPEN_LEAD before the next window.
        assert_eq!(s.step(t0 + 949 * MS, 0), None);
        assert_eq!(s.step(t0 + 951 * MS, 0), Some(Detail::Full));
    }

    #[test]
    fn a_drain_is_bounded_and_a_new_window_reopens_it() {
        let cfg = parse_sampling("100ms/1s").unwrap().unwrap();
        let mut s = Sampler::new(cfg, Duration::from_millis(300));
        let t0 = 1_700_000_000_000 * MS;
        assert_eq!(s.step(t0 + 150 * MS, 5), Some(Detail::Draining));
        assert_eq!(s.step(t0 + 449 * MS, 5), None);
        assert_eq!(s.step(t0 + 450 * MS, 5), Some(Detail::Off));
        // ... and to half the closed time before the next window's lead: 100 ms of
        // every 250 ms allows 50 ms of drain, whatever the hold.
        let cfg2 = parse_sampling("100ms/250ms").unwrap().unwrap();
        let mut s2 = Sampler::new(cfg2, Duration::from_millis(1000));
        assert_eq!(s2.step(t0 + 100 * MS, 5), Some(Detail::Draining));
        assert_eq!(s2.step(t0 + 149 * MS, 5), None);
        assert_eq!(s2.step(t0 + 150 * MS, 5), Some(Detail::Off));
        assert_eq!(s2.step(t0 + 200 * MS, 5), Some(Detail::Full));
        // A drain that runs into the next window reopens it.
        let mut s = Sampler::new(cfg, Duration::from_millis(60_000));
        assert_eq!(s.step(t0 + 150 * MS, 5), Some(Detail::Draining));
        assert_eq!(s.step(t0 + 951 * MS, 5), Some(Detail::Full));
    }
}
