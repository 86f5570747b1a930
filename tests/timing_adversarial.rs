//! Per-op GPU-stamp timing under hostile conditions, driven on the CPU with the
//! stand-in driver (tests/fixtures/fake_cuda.c): many threads on many streams, fork
//! with stamps in flight, a driver that refuses every stamp launch or cannot make the
//! stamp kernel or its slots, threads without a context, a capture on a blocking
//! stream while another thread uses the legacy one, a drifting GPU clock, a GPU far
//! behind at exit, pauses, budget edge values, wide groups and failing calls, one
//! thread's slow per-thread default stream beside another's, a capture begun on the
//! op's stream during the call. In each:
//! the program's behaviour is unchanged (exit status, stdout, nothing on stderr),
//! every process ends within a bound, nothing is launched into a capturing stream, no
//! row is lost, and the process row's counts agree with the ops rows.

mod common;
mod support;

use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use support::{Row, Run, text};

fn cuda() -> String {
    common::fixtures().libcuda.display().to_string()
}

/// Runs `c` to its end, killing it (and failing the test) after `limit`.
fn bounded(mut c: Command, limit: Duration) -> Output {
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    let t0 = Instant::now();
    let mut child = c.spawn().expect("spawn host");
    let mut so = child.stdout.take().unwrap();
    let mut se = child.stderr.take().unwrap();
    let ro = std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = so.read_to_end(&mut b);
        b
    });
    let re = std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = se.read_to_end(&mut b);
        b
    });
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("host did not end within {limit:?} (deadlock?)");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    Output {
        status,
        stdout: ro.join().unwrap(),
        stderr: re.join().unwrap(),
    }
}

/// `host ARGS` under the shim with the stand-in driver, bounded by `limit`; asserts
/// exit 0, `stdout` as the program prints it, an empty stderr. Returns the output and
/// the driver's counters.
fn run_driver(
    run: &Run,
    args: &[&str],
    env: &[(&str, &str)],
    limit: Duration,
) -> (Output, HashMap<String, u64>) {
    let stats = run.scratch("cuda-stats");
    let mut c = run.host(args);
    c.env("HOST_CUDA", cuda()).env("FAKE_CUDA_STATS_FILE", &stats);
    c.envs(env.iter().copied());
    let out = bounded(c, limit);
    assert!(out.status.success(), "{args:?}: {out:?}");
    assert!(out.stderr.is_empty(), "{args:?}: {}", text(&out.stderr));
    // Every scenario but `threads` ends with "ok".
    let want = if args[0] == "threads" { "" } else { "ok\n" };
    assert_eq!(text(&out.stdout), want, "{args:?}");
    (out, common::read_cuda_stats(&stats))
}

fn process(run: &Run) -> Row {
    let mut p = run.rows("process");
    assert_eq!(p.len(), 1, "{p:?}");
    p.remove(0)
}

const LIMIT: Duration = Duration::from_secs(10);

/// The launching calls of a run (an ungrouped op, or a group: its ops share the
/// timing), each with its rows.
fn launching_calls(ops: &[Row]) -> BTreeMap<(u64, u64), Vec<&Row>> {
    let mut calls: BTreeMap<(u64, u64), Vec<&Row>> = BTreeMap::new();
    for o in ops {
        let key = o.u64("group_id").map_or((o.req_u64("op_id"), 0), |g| (0, g));
        calls.entry(key).or_default().push(o);
    }
    for (k, rows) in &calls {
        let t: Vec<_> = rows.iter().map(|o| o.str("timing")).collect();
        assert!(
            t.windows(2).all(|w| w[0] == w[1]),
            "{k:?}: ops of a group share its timing: {t:?}"
        );
        let g: Vec<_> = rows
            .iter()
            .map(|o| (o.i64("gpu_ready_ns"), o.i64("gpu_end_ns")))
            .collect();
        assert!(g.windows(2).all(|w| w[0] == w[1]), "{k:?}: and its span: {g:?}");
    }
    calls
}

/// How many launching calls have each `timing`, and how many timed ones lack times.
struct Tally {
    by_timing: HashMap<String, u64>,
    timed_without_times: u64,
}

impl Tally {
    fn of(ops: &[Row]) -> Tally {
        let mut by_timing: HashMap<String, u64> = HashMap::new();
        let mut timed_without_times = 0;
        for rows in launching_calls(ops).values() {
            let o = rows[0];
            let t = o.req_str("timing").to_string();
            if t == "timed" {
                match (o.i64("gpu_ready_ns"), o.i64("gpu_end_ns")) {
                    (Some(r), Some(e)) => {
                        assert!(e >= r, "end before ready: {o:?}");
                        assert_eq!(o.str("gpu_source"), Some("stamps"), "{o:?}");
                    }
                    (None, None) => timed_without_times += 1,
                    other => panic!("half a span {other:?}: {o:?}"),
                }
            } else {
                for col in ["gpu_ready_ns", "gpu_end_ns"] {
                    assert!(o.is_null(col), "{col} of an op not timed: {o:?}");
                }
            }
            *by_timing.entry(t).or_default() += 1;
        }
        Tally {
            by_timing,
            timed_without_times,
        }
    }
    fn n(&self, t: &str) -> u64 {
        self.by_timing.get(t).copied().unwrap_or(0)
    }
}

/// The process row's timing counts agree with the ops rows; returns the tally.
fn counts_agree(run: &Run) -> (Row, Vec<Row>, Tally) {
    let p = process(run);
    let ops = run.rows("ops");
    let t = Tally::of(&ops);
    assert!(p.req_str("gpu_timing").starts_with("on"), "{p:?}");
    assert_eq!(
        p.u64("ops_timed"),
        Some(t.n("timed")),
        "ops_timed: {:?}",
        t.by_timing
    );
    assert_eq!(
        p.u64("timing_pool_empty"),
        Some(t.n("pool_empty")),
        "timing_pool_empty: {:?}",
        t.by_timing
    );
    assert_eq!(
        p.u64("timing_captured"),
        Some(t.n("graph_capture")),
        "timing_captured: {:?}",
        t.by_timing
    );
    assert_eq!(
        p.u64("ops_timing_lost"),
        Some(t.timed_without_times),
        "ops_timing_lost: the timed launching calls without times ({:?})",
        t.by_timing
    );
    assert_eq!(p.u64("ops_rows"), Some(ops.len() as u64), "no row lost");
    (p, ops, t)
}

#[test]
fn many_threads_on_many_streams_at_once() {
    let run = Run::new("adv-threads");
    let (_, stats) = run_driver(&run, &["threads", "12", "150"], &[("ZCTA_BUDGET", "all")], LIMIT);
    let (_, ops, t) = counts_agree(&run);
    assert_eq!(ops.len(), 12 * 150);
    assert_eq!(t.n("error"), 0, "{:?}", t.by_timing);
    assert!(t.n("timed") > 0, "{:?}", t.by_timing);
    assert_eq!(t.timed_without_times, 0);
    assert_eq!(stats["stamps_on_capturing"], 0);
    assert_eq!(stats["stamps_failed"], 0);
    // zcta's two kernels (stamp and anchor, a module each) and one set of slots for the
    // one context, however many threads met it at once.
    assert_eq!((stats["modules"], stats["host_allocs"]), (2, 1), "{stats:?}");
    // Each stream is one in-order queue: its timed ops, in call order, never overlap
    // (the clock anchor is the same for all; allow its error and a little drift).
    let mut by_stream: HashMap<u64, Vec<&Row>> = HashMap::new();
    for o in ops.iter().filter(|o| !o.is_null("gpu_end_ns")) {
        by_stream.entry(o.req_u64("stream")).or_default().push(o);
    }
    assert!(!by_stream.is_empty() && by_stream.len() <= 12);
    for (s, mut v) in by_stream {
        v.sort_by_key(|o| o.req_i64("api_start_ns"));
        for w in v.windows(2) {
            let (e0, r1) = (w[0].req_i64("gpu_end_ns"), w[1].req_i64("gpu_ready_ns"));
            assert!(
                r1 >= e0 - 100_000,
                "stream {s:#x}: ready {r1} before the previous end {e0}"
            );
        }
    }
}

#[test]
fn fork_with_stamps_in_flight() {
    // The GPU is 2 ms behind per op: the parent has stamps pending when it forks. (The
    // child checks that it launches no stamp and makes no stamp kernel or slots.)
    let run = Run::new("adv-fork");
    let (_, stats) = run_driver(
        &run,
        &["fork_busy", "40"],
        &[("ZCTA_BUDGET", "all"), ("FAKE_CUDA_KERNEL_NS", "2000000")],
        LIMIT,
    );
    // One process row: the child's rows are none (a fork child does not record).
    let (_, ops, t) = counts_agree(&run);
    assert_eq!(ops.len(), 1 + 40 + 3, "the parent's ops only: {}", ops.len());
    // (The thread's burst may outrun the pool's first pairs: pool_empty, counted.)
    assert_eq!(t.n("error"), 0, "{:?}", t.by_timing);
    assert!(t.n("timed") > 0, "{:?}", t.by_timing);
    assert_eq!(stats["stamps_on_capturing"], 0);
}

#[test]
fn a_driver_that_refuses_every_stamp_launch() {
    let run = Run::new("adv-launchfail");
    let (_, stats) = run_driver(
        &run,
        &["streams", "5", "0"],
        &[("ZCTA_BUDGET", "all"), ("FAKE_CUDA_LAUNCH_FAIL", "1")],
        LIMIT,
    );
    let (p, ops, t) = counts_agree(&run);
    assert_eq!(ops.len(), 5 + 10 + 2);
    // Every launching call but the group over two streams tried, and was refused.
    assert_eq!(t.n("error"), 5 + 5, "{:?}", t.by_timing);
    assert_eq!(t.n("streams"), 1);
    assert_eq!(
        p.u64("timing_errors"),
        Some(10),
        "one refused stamp per op: {p:?}"
    );
    assert_eq!(stats["stamps"], 0);
    // Each call's ready stamp was refused (its end stamp then not tried), and each of
    // the writer's anchor attempts gave up at its first refusal.
    assert!(stats["stamps_failed"] >= 10, "{stats:?}");
    assert!(p.is_null("gpu_clock_error_ns"), "no anchor could be made: {p:?}");
}

#[test]
fn threads_without_a_context() {
    // Only the thread that loaded the driver has the context current: the program's
    // other threads and the writer have none. The writer makes it current itself, and
    // the hot path for each stamp it launches (the stand-in refuses a launch without
    // it, as a module's function belongs to its context).
    let run = Run::new("adv-noctx");
    let (_, stats) = run_driver(
        &run,
        &["threads", "4", "30"],
        &[
            ("ZCTA_BUDGET", "all"),
            ("FAKE_CUDA_NO_CTX_THREADS", "1"),
            ("HOST_ITER_GAP_MS", "3"),
        ],
        LIMIT,
    );
    let (p, ops, t) = counts_agree(&run);
    assert_eq!(ops.len(), 4 * 30);
    assert_eq!(t.n("error"), 0, "{:?}", t.by_timing);
    assert!(t.n("timed") > 0, "the writer filled the pool: {:?}", t.by_timing);
    assert_eq!(t.timed_without_times, 0, "{p:?}");
    assert_eq!(p.u64("timing_errors"), Some(0), "{p:?}");
    assert_eq!(stats["stamps_failed"], 0, "{stats:?}");
    // The writer made zcta's kernels and their slots, with the context made current.
    assert_eq!((stats["modules"], stats["host_allocs"]), (2, 1), "{stats:?}");
}

#[test]
fn a_blocking_capture_while_another_thread_uses_the_legacy_stream() {
    let run = Run::new("adv-capture-mt");
    let iters = 5;
    let (_, stats) = run_driver(
        &run,
        &["capture_mt", &iters.to_string()],
        &[("ZCTA_BUDGET", "all"), ("FAKE_CUDA_CAPTURE_BLOCKING", "1")],
        LIMIT,
    );
    assert_eq!(stats["stamps_on_capturing"], 0, "{stats:?}");
    assert_eq!(stats["captures_invalidated"], 0, "{stats:?}");
    assert_eq!(stats["unsafe_during_capture"], 0, "{stats:?}");
    let (p, ops, t) = counts_agree(&run);
    assert_eq!(ops.len(), 1 + 2 * iters + iters + iters);
    let on = |s: u64| -> Vec<&Row> {
        let mut v: Vec<&Row> = ops.iter().filter(|o| o.req_u64("stream") == s).collect();
        v.sort_by_key(|o| o.req_i64("api_start_ns"));
        v
    };
    let legacy = on(0);
    assert_eq!(legacy.len(), 1 + 2 * iters);
    // Before and after the capture: timed. During it: the driver will not say whether
    // the legacy stream is capturing (it would join the capture): not touched.
    let timing = |v: &[&Row]| {
        v.iter()
            .map(|o| o.req_str("timing").to_string())
            .collect::<Vec<_>>()
    };
    let lt = timing(&legacy);
    assert_eq!(lt[0], "timed");
    assert!(lt[1..=iters].iter().all(|t| t == "error"), "{lt:?}");
    assert!(lt[iters + 1..].iter().all(|t| t == "timed"), "{lt:?}");
    let other = timing(&on(0x5000));
    assert!(other.iter().all(|t| t == "timed"), "{other:?}");
    let captured = timing(&on(0x6000));
    assert!(captured.iter().all(|t| t == "graph_capture"), "{captured:?}");
    assert_eq!(p.u64("timing_errors"), Some(iters as u64), "{p:?}");
    assert_eq!(t.timed_without_times, 0);
}

#[test]
fn a_drifting_gpu_clock_stays_within_the_claimed_bound() {
    // The GPU clock runs 20 % fast. Each op's stream is idle when it is called, so its
    // ready stamp runs when it was launched, just before the call. Every time must lie
    // within the process row's error (1 ms for the call's own host-side span).
    // With the default hold an op's ready time waits for the anchor after it and is
    // placed on the line through the two around it: the drift does not move it (the
    // typical op lies within the anchors' own errors of where it ran — milliseconds
    // on a loaded machine — where from an anchor a quarter of a second away it would
    // be ~50 ms out). With a 10 ms hold (`ZCTA_GPU_HOLD_MS`) times are placed from the
    // nearest anchor as soon as they are read: the error then covers the most drift
    // the anchors allow over the farthest a time was from its anchor.
    for (hold, between) in [(None, true), (Some("10"), false)] {
        let run = Run::new("adv-drift");
        let mut env = vec![("ZCTA_BUDGET", "all"), ("FAKE_CUDA_CLOCK_PPM", "200000")];
        if let Some(h) = hold {
            env.push(("ZCTA_GPU_HOLD_MS", h));
        }
        run_driver(&run, &["streams", "60", "20000"], &env, LIMIT);
        let (p, ops, t) = counts_agree(&run);
        assert_eq!(t.timed_without_times, 0, "{hold:?}: {p:?}");
        let err = p.req_i64("gpu_clock_error_ns");
        let drift = p.req_i64("gpu_clock_drift_ns_per_s");
        assert!(drift > 100_000_000, "{hold:?}: a 20 % drift is seen: {p:?}");
        let mut offs: Vec<i64> = ops
            .iter()
            .filter(|o| o.u64("group_id").is_none())
            .map(|o| (o.req_i64("gpu_ready_ns") - o.req_i64("api_start_ns")).abs())
            .collect();
        offs.sort_unstable();
        let (median, worst) = (offs[offs.len() / 2], offs[offs.len() - 1]);
        if between {
            assert!(
                median < 10_000_000,
                "between anchors the drift does not move a time: median {median} ns off: {p:?}"
            );
        } else {
            assert!(
                err > drift / 10,
                "from one anchor the error covers the drift over 100 ms and more: {p:?}"
            );
        }
        // The drift seen is what lies beyond both anchors' errors, so it reads low by
        // up to their sum over the 0.5 s between them (wide on a loaded machine): 0.1 s
        // of the drift for that. Without the drift's part an op placed from an anchor
        // 0.5 s away is ~100 ms out.
        let allow = err + 1_000_000 + drift / 10;
        assert!(
            worst <= allow,
            "{hold:?}: an op {worst} ns off, the row allows {allow}: {p:?}"
        );
    }
}

#[test]
fn a_short_run_on_a_drifting_clock_still_bounds_its_times() {
    // Under half a second, shorter than an anchor's renewal: the clock gets a second
    // anchor at the end, so its drift is measured and the row's error covers the
    // times placed by the first, off by 2 % of their distance from it.
    let run = Run::new("adv-drift-short");
    run_driver(
        &run,
        &["streams", "15", "20000"],
        &[("ZCTA_BUDGET", "all"), ("FAKE_CUDA_CLOCK_PPM", "20000")],
        LIMIT,
    );
    let (p, ops, _) = counts_agree(&run);
    let err = p.req_i64("gpu_clock_error_ns");
    let worst = ops
        .iter()
        .filter(|o| o.u64("group_id").is_none())
        .map(|o| (o.req_i64("gpu_ready_ns") - o.req_i64("api_start_ns")).abs())
        .max()
        .unwrap();
    let drift = p.req_i64("gpu_clock_drift_ns_per_s");
    // Seen: what lies beyond both anchors' errors, which on a loaded machine take a
    // good part of a 2 % drift over the short span between them.
    assert!(drift > 1_000_000, "the drift is seen: {p:?}");
    // As in the long run's test: 1 ms for the call's own host-side span, 0.1 s of the
    // drift for the drift seen reading low.
    let allow = err + 1_000_000 + drift / 10;
    assert!(
        worst <= allow,
        "an op {worst} ns off, the row allows {allow}: {p:?}"
    );
}

#[test]
fn a_gpu_far_behind_at_exit() {
    // Each op takes 1 s of GPU time: none is done when the program exits. The exit is
    // bounded, every row is written, every timed call is counted lost once.
    let run = Run::new("adv-behind");
    let t0 = Instant::now();
    run_driver(
        &run,
        &["threads", "1", "30"],
        &[("ZCTA_BUDGET", "all"), ("FAKE_CUDA_KERNEL_NS", "1000000000")],
        LIMIT,
    );
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "exit took {:?}",
        t0.elapsed()
    );
    let (p, ops, t) = counts_agree(&run);
    assert_eq!(ops.len(), 30);
    assert_eq!(t.n("timed"), 30, "{:?}", t.by_timing);
    assert_eq!(p.u64("ops_timing_lost"), Some(30), "{p:?}");

    // A group is one launching call, counted once however many ops it has.
    let run = Run::new("adv-behind-group");
    run_driver(
        &run,
        &["wide_group", "8"],
        &[("ZCTA_BUDGET", "all"), ("FAKE_CUDA_KERNEL_NS", "1000000000")],
        LIMIT,
    );
    let (p, ops, t) = counts_agree(&run);
    assert_eq!(ops.len(), 16);
    assert_eq!((t.n("timed"), t.n("streams")), (1, 1), "{:?}", t.by_timing);
    assert_eq!(p.u64("ops_timing_lost"), Some(1), "{p:?}");
}

/// `host SCENARIO 3000 40 2000` puts 3 s of the program's own work and one op behind it
/// on one stream, then 40 ops on another, idle one, 2 ms apart (`idle` picks those out
/// of the rows): they are all timed, done long before the program ends; only the op
/// behind the work is not.
fn slow_work_holds_back_only_its_stream(scenario: &str, idle: impl Fn(&Row, &[Row]) -> bool) {
    let run = Run::new(&format!("adv-{scenario}"));
    run_driver(
        &run,
        &[scenario, "3000", "40", "2000"],
        &[("ZCTA_BUDGET", "all")],
        LIMIT,
    );
    let (_, ops, t) = counts_agree(&run);
    assert_eq!(ops.len(), 41);
    let idle: Vec<&Row> = ops.iter().filter(|o| idle(o, &ops)).collect();
    assert_eq!(idle.len(), 40, "{scenario}");
    let untimed = idle.iter().filter(|o| o.is_null("gpu_end_ns")).count();
    assert_eq!(
        untimed, 0,
        "{scenario}: ops on the idle stream lost behind the slow one: {:?}",
        t.by_timing
    );
    assert_eq!(
        t.timed_without_times, 1,
        "{scenario}: only the op behind 3 s of work"
    );
}

#[test]
fn a_slow_stream_does_not_hold_back_the_others() {
    slow_work_holds_back_only_its_stream("slow_stream", |o, _| o.req_u64("stream") == 0x6000);
}

#[test]
fn one_threads_slow_default_stream_does_not_hold_back_anothers() {
    // The per-thread default stream has the same handle (2) on every thread: the work
    // is on one thread's, the idle ops on another thread's (the one that issues last).
    slow_work_holds_back_only_its_stream("slow_thread_stream", |o, ops| {
        let last = ops.iter().max_by_key(|r| r.req_u64("op_id")).unwrap();
        o.req_u64("tid") == last.req_u64("tid")
    });
}

#[test]
fn a_capture_begun_on_the_stream_during_the_call() {
    // The stand-in NCCL begins a capture on the op's stream inside the call (another
    // thread of the program could): the op's end stamp must not go into the graph,
    // and the stream's later ops are timed.
    let run = Run::new("adv-capture-in-call");
    let (_, stats) = run_driver(
        &run,
        &["capture_in_call", "10"],
        &[("ZCTA_BUDGET", "all"), ("FAKE_NCCL_CAPTURE_IN_CALL", "1")],
        LIMIT,
    );
    assert_eq!(stats["stamps_on_capturing"], 0, "{stats:?}");
    let (p, ops, t) = counts_agree(&run);
    assert_eq!(ops.len(), 11);
    let first = ops.iter().min_by_key(|o| o.req_u64("op_id")).unwrap();
    assert_eq!(first.str("timing"), Some("error"), "{first:?}");
    assert_eq!(p.u64("timing_errors"), Some(1), "{p:?}");
    assert_eq!(t.n("timed"), 10, "{:?}", t.by_timing);
    assert_eq!(t.timed_without_times, 0, "{:?}", t.by_timing);
}

#[test]
fn a_communicator_split_alone_in_a_group_keys_its_ops_by_comm_id_and_seq() {
    // A split made alone inside a group is initialised at the group's end, where NCCL
    // is asked its rank: the budget's key of its Send/Recv in the next group is then
    // (comm_id, ranks, seq), the same on every rank, not this rank's op id. Only a
    // group timed above level 0 can show it; how many the level leaves depends on the
    // machine's speed, so the run is repeated (at most 3 times) until one was judged.
    let mut judged = 0;
    for _ in 0..3 {
        let run = Run::new("adv-split-p2p");
        let idf = run.scratch("id");
        common::write_unique_id(&idf);
        run_driver(
            &run,
            &["split_p2p", idf.to_str().unwrap(), "4000"],
            &[("ZCTA_BUDGET", "5%"), ("FAKE_NCCL_SPLIT_NRANKS", "2")],
            Duration::from_secs(30),
        );
        let (_, ops, _) = counts_agree(&run);
        for rows in launching_calls(&ops).values() {
            let o = rows[0];
            if o.str("op") == Some("AllReduce") || o.str("timing") != Some("timed") {
                continue;
            }
            let level = o.req_u64("timing_level") as u8;
            let keys: Vec<u64> = rows
                .iter()
                .map(|r| {
                    assert_eq!(r.i32("rank"), Some(0), "{r:?}");
                    let (send, recv) = match r.req_str("op") {
                        "Send" => (0, 1),
                        _ => (1, 0),
                    };
                    zcta::budget::p2p_key(r.req_u64("comm_id"), send, recv, r.req_u64("seq"))
                })
                .collect();
            assert!(
                keys.iter().any(|&k| zcta::budget::selected(k, level)),
                "a group timed at level {level} whose ops the budget did not select: {rows:?}"
            );
            judged += u64::from(level > 0);
        }
        if judged > 0 {
            break;
        }
    }
    assert!(
        judged > 0,
        "no group timed above level 0 in 3 runs: the check judged nothing"
    );
}

#[test]
fn pause_and_resume_around_timed_ops() {
    // Each op takes 10 ms on the GPU (the paused ones too): the first ops' stamps
    // run while paused, all of them within the exit's wait.
    let run = Run::new("adv-pause");
    let stats_path = run.scratch("cuda-stats");
    let mut c = run.host(&["pause"]);
    c.env("HOST_CUDA", cuda())
        .env("FAKE_CUDA_STATS_FILE", &stats_path)
        .env("ZCTA_BUDGET", "all")
        .env("FAKE_CUDA_KERNEL_NS", "10000000");
    let out = bounded(c, LIMIT);
    assert!(out.status.success() && out.stderr.is_empty(), "{out:?}");
    assert!(
        text(&out.stdout).starts_with("ok prev=1,0"),
        "{}",
        text(&out.stdout)
    );
    let stats = common::read_cuda_stats(&stats_path);
    let (_, ops, t) = counts_agree(&run);
    assert_eq!(ops.len(), 6, "the paused ops have no rows");
    assert_eq!(t.n("timed"), 6, "{:?}", t.by_timing);
    assert_eq!(t.timed_without_times, 0);
    // No stamp for the paused ops: two per timed op, the rest are anchors.
    assert!(common::anchor_launches(&stats, 6) > 0, "{stats:?}");
    assert_eq!(stats["stamps_written"], stats["stamps"], "{stats:?}");
}

#[test]
fn a_burst_after_a_quiet_stretch_pays_as_it_goes() {
    // One op, 600 ms of nothing (the writer evaluates the budget twice meanwhile),
    // then 3,000 ops back to back. The quiet stretch earns no credit: the burst's
    // timing costs at most the budget's share of the burst itself plus 20 µs, and a
    // timed op costs at least its two stamps' stream time (2 x 1,730 ns). A budget
    // summed since its last evaluation would have let the burst spend 1 % of the
    // quiet stretch too: hundreds of timed ops.
    let run = Run::new("adv-burst");
    run_driver(&run, &["burst", "600", "3000"], &[], LIMIT);
    let (_, ops, _) = counts_agree(&run);
    let ars: Vec<_> = ops.iter().filter(|o| o.str("op") == Some("AllReduce")).collect();
    assert_eq!(ars.len(), 3001);
    let burst = &ars[1..];
    let span = burst.last().unwrap().req_i64("api_end_ns") - burst[0].req_i64("api_start_ns");
    let timed = burst.iter().filter(|o| o.str("timing") == Some("timed")).count() as f64;
    let most = (0.01 * span as f64 + 20_000.0) / 3_460.0 + 2.0;
    assert!(
        timed >= 1.0 && timed <= most,
        "{timed} ops timed in {span} ns (at most {most})"
    );
}

#[test]
fn a_slow_driver_costs_the_budget_too() {
    // 300 ops 1 ms apart under a 1 % budget. Each cuLaunchKernel takes 300 µs under
    // the driver's lock, so a timed op's two stamps cost the hot path 600 µs, which
    // it measures and charges: the budget pays for a few of them, not for the hot
    // path's few µs alone (with a fast driver it times most ops on an idle machine,
    // about 260 of them; not asserted: on a loaded one, a timed op the scheduler
    // preempts costs the budget as much).
    let run = Run::new("adv-slow-driver");
    let (_, stats) = run_driver(
        &run,
        &["threads", "1", "300"],
        &[("HOST_ITER_GAP_MS", "1"), ("FAKE_CUDA_LAUNCH_NS", "300000")],
        Duration::from_secs(30),
    );
    let (p, _, t) = counts_agree(&run);
    let timed = t.n("timed");
    assert!(
        (1..=40).contains(&timed),
        "{timed} of 300 timed: {:?} {stats:?}",
        t.by_timing
    );
    assert_eq!(t.n("error"), 0, "{:?} {p:?}", t.by_timing);
    // Two stamps per timed op, the rest are anchors (whose launches are slow too).
    assert!(common::anchor_launches(&stats, timed) > 0, "{stats:?}");
}

#[test]
fn a_slow_launch_does_not_widen_the_clock_anchors() {
    // Each cuLaunchKernel takes 300 µs. An anchor taken with a stamp brackets its
    // launch (the GPU time lies somewhere in it): an error of at least 150 µs. The
    // anchor kernel is launched first and brackets only the release of its flag and
    // the sight of its time, so the launch does not count.
    // (On a loaded machine a try's bracket can also hold the writer's time off the
    // CPU, and a round where no try answered falls back to a stamp: the kernel here
    // waits 50 ms for its flag, not 1, so that a writer held off the CPU still gets
    // its answer, and the smallest error of up to three runs is taken.)
    let slow = [("HOST_ITER_GAP_MS", "1"), ("FAKE_CUDA_LAUNCH_NS", "300000")];
    let gated_env = [slow[0], slow[1], ("FAKE_CUDA_ANCHOR_WAIT_NS", "50000000")];
    let mut gated = Vec::new();
    for _ in 0..3 {
        let run = Run::new("adv-anchor-gated");
        let (_, stats) = run_driver(
            &run,
            &["threads", "1", "300"],
            &gated_env,
            Duration::from_secs(30),
        );
        let (p, _, _) = counts_agree(&run);
        assert!(stats["anchors"] > 0, "{stats:?}");
        gated.push(p.req_i64("gpu_clock_error_ns"));
        if gated.iter().any(|&e| e < 150_000) {
            break;
        }
    }
    assert!(
        gated.iter().any(|&e| e < 150_000),
        "the anchor kernel's errors {gated:?} ns"
    );
    // The same where the driver gives no anchor kernel: anchors are stamps.
    let run = Run::new("adv-anchor-stamped");
    let env = [slow[0], slow[1], ("FAKE_CUDA_NO_ANCHOR", "1")];
    let (_, stats) = run_driver(&run, &["threads", "1", "300"], &env, Duration::from_secs(30));
    let (p, _, t) = counts_agree(&run);
    assert_eq!(stats["anchors"], 0, "{stats:?}");
    assert!(common::anchor_launches(&stats, t.n("timed")) > 0, "{stats:?}");
    let stamped = p.req_i64("gpu_clock_error_ns");
    assert!(
        stamped >= 150_000,
        "a stamp's error {stamped} ns brackets its launch: {p:?}"
    );
}

#[test]
fn budget_edge_values() {
    // 100 %: the cost model counts each stamp's stream time as if on the critical
    // path, so a tight loop of ops can cost more than its wall time: some may still be
    // left to the budget. The tiny budgets leave most ops untimed.
    for (v, tiny) in [("100%", false), ("1e-300%", true), ("0.0000001", true)] {
        let run = Run::new("adv-budget");
        // Spread over 150 ms: the writer evaluates the budget meanwhile.
        let (_, stats) = run_driver(
            &run,
            &["threads", "1", "150"],
            &[("ZCTA_BUDGET", v), ("HOST_ITER_GAP_MS", "1")],
            LIMIT,
        );
        let (p, ops, t) = counts_agree(&run);
        assert_eq!(ops.len(), 150, "{v}");
        assert_eq!(
            t.n("timed") + t.n("pool_empty") + t.n("budget"),
            150,
            "{v}: {:?}",
            t.by_timing
        );
        // Only a call the budget selected asks the driver about its stream (before its
        // ready stamp, and a timed one again before its end stamp); one left to the
        // budget touches neither.
        assert_eq!(
            stats["capture_queries"],
            2 * t.n("timed") + t.n("pool_empty"),
            "{v}: {:?} {stats:?}",
            t.by_timing
        );
        if tiny {
            assert!(t.n("budget") > 0, "{v}: {:?} {p:?}", t.by_timing);
        } else {
            assert!(t.n("timed") > 0, "{v}: {:?}", t.by_timing);
        }
        for o in &ops {
            let asked = matches!(o.str("timing"), Some("timed" | "budget"));
            assert_eq!(o.u64("timing_level").is_some(), asked, "{v}: {o:?}");
            let level = o.u64("timing_level").unwrap_or(0);
            assert!(level <= u64::from(zcta::budget::MAX_LEVEL), "{v}: {o:?}");
        }
    }
    // Malformed or out of range: one warning, the default budget, and timing goes on.
    for v in ["0", "0%", "-1%", "nan", "inf", "101%", "1%%"] {
        let run = Run::new("adv-budget-bad");
        let mut c = run.host(&["threads", "1", "5"]);
        c.env("HOST_CUDA", cuda()).env("ZCTA_BUDGET", v);
        let out = bounded(c, LIMIT);
        assert!(out.status.success(), "{v}: {out:?}");
        let err = text(&out.stderr);
        assert_eq!(err.lines().count(), 1, "{v}: {err}");
        assert!(err.contains("ZCTA_BUDGET"), "{v}: {err}");
        let p = process(&run);
        assert!(
            p.req_str("gpu_timing").starts_with("on (GPU stamps, budget 1% "),
            "{v}: {p:?}"
        );
    }
}

#[test]
fn a_group_over_many_streams() {
    let run = Run::new("adv-wide");
    let (_, stats) = run_driver(&run, &["wide_group", "64"], &[("ZCTA_BUDGET", "all")], LIMIT);
    let (_, ops, t) = counts_agree(&run);
    assert_eq!(ops.len(), 128);
    assert_eq!(t.n("streams"), 1, "{:?}", t.by_timing);
    assert_eq!(t.n("timed"), 1, "{:?}", t.by_timing);
    // One pair for the group on one stream; the rest are anchors.
    assert!(common::anchor_launches(&stats, 1) > 0, "{stats:?}");
}

#[test]
fn calls_that_fail() {
    // Ops whose NCCL call fails launch nothing: not timed, 'error', no times, and no
    // driver call failed (timing_errors counts those).
    let run = Run::new("adv-errors");
    let stats_path = run.scratch("cuda-stats");
    let mut c = run.host(&["errors"]);
    c.env("HOST_CUDA", cuda())
        .env("FAKE_CUDA_STATS_FILE", &stats_path)
        .env("ZCTA_BUDGET", "all");
    let out = bounded(c, LIMIT);
    let plain = bounded(
        {
            let mut c = support::host_plain(&["errors"]);
            c.env("HOST_CUDA", cuda());
            c
        },
        LIMIT,
    );
    assert_eq!(out.status.code(), plain.status.code());
    assert_eq!(out.stdout, plain.stdout);
    assert!(out.stderr.is_empty(), "{}", text(&out.stderr));
    let stats = common::read_cuda_stats(&stats_path);
    let (p, ops, t) = counts_agree(&run);
    let failed: Vec<&Row> = ops.iter().filter(|o| o.req_i32("result") != 0).collect();
    assert_eq!(failed.len(), 4, "{ops:?}");
    for o in &failed {
        assert_eq!(o.str("timing"), Some("error"), "{o:?}");
    }
    assert_eq!(t.n("timed"), 0);
    assert_eq!(p.u64("timing_errors"), Some(0), "{p:?}");
    assert_eq!(stats["stamps_failed"], 0);
}

/// What an ops row says of its call on the host side: every column but the GPU
/// side's, the timing's, and those that differ from run to run (ids, addresses,
/// times; of the ids and times, whether they are set). (`launch_ns` is kept with a
/// timed op's GPU side only; `graph_captured`, where NCCL did not say, comes from the
/// timing's capture check, which an op whose timing is an error does not report.)
fn host_side(o: &Row) -> Vec<(String, String)> {
    const GPU: [&str; 13] = [
        "timing",
        "timing_level",
        "launch_ns",
        "graph_captured",
        "gpu_ready_ns",
        "gpu_start_ns",
        "gpu_end_ns",
        "gpu_source",
        "engine",
        "kernel",
        "n_kernels",
        "n_memcpy",
        "memcpy_bytes",
    ];
    const PER_RUN: [&str; 6] = ["comm_ptr", "sendbuff", "recvbuff", "pid", "tid", "host"];
    o.0.iter()
        .filter(|(k, _)| !GPU.contains(&k.as_str()) && !PER_RUN.contains(&k.as_str()))
        .map(|(k, v)| {
            let v = if k.ends_with("_ns") || k.ends_with("_id") {
                format!("set: {}", !o.is_null(k))
            } else {
                format!("{v:?}")
            };
            (k.clone(), v)
        })
        .collect()
}

#[test]
fn a_driver_that_cannot_make_the_stamp_kernel_or_its_slots() {
    // The stamp kernel (cuModuleLoadData) or the slots it writes (cuMemHostAlloc)
    // cannot be made in the context: its ops are not timed, each selected launching
    // call says so (an error, counted), nothing is launched, no anchor is made, and
    // the program and the host side of every row are as with a driver that can.
    let baseline = Run::new("adv-stamper-ok");
    run_driver(
        &baseline,
        &["streams", "5", "0"],
        &[("ZCTA_BUDGET", "all")],
        LIMIT,
    );
    let (_, want, t) = counts_agree(&baseline);
    assert_eq!(t.n("timed"), 10, "{:?}", t.by_timing);
    let mut want: Vec<_> = want.iter().map(host_side).collect();
    want.sort();
    // (knob, modules loaded, host allocations made)
    for (knob, modules, allocs) in [
        ("FAKE_CUDA_MODULE_FAIL", 0, 0),
        ("FAKE_CUDA_HOST_ALLOC_FAIL", 2, 0),
    ] {
        let run = Run::new("adv-stamper-fail");
        let (_, stats) = run_driver(
            &run,
            &["streams", "5", "0"],
            &[("ZCTA_BUDGET", "all"), (knob, "1")],
            LIMIT,
        );
        let (p, ops, t) = counts_agree(&run);
        assert_eq!(ops.len(), 5 + 10 + 2, "{knob}");
        // Every launching call but the group over two streams was selected.
        assert_eq!(
            (t.n("error"), t.n("streams")),
            (5 + 5, 1),
            "{knob}: {:?}",
            t.by_timing
        );
        assert_eq!(p.u64("timing_errors"), Some(10), "{knob}: {p:?}");
        assert!(
            p.req_str("gpu_timing").starts_with("on (GPU stamps"),
            "{knob}: {p:?}"
        );
        assert!(p.is_null("gpu_clock_error_ns"), "{knob}: no anchor: {p:?}");
        assert_eq!(
            (stats["stamps"], stats["stamps_failed"]),
            (0, 0),
            "{knob}: nothing launched: {stats:?}"
        );
        // Tried once for the context, not again for each op.
        assert_eq!(
            (stats["modules"], stats["host_allocs"]),
            (modules, allocs),
            "{knob}: {stats:?}"
        );
        let mut got: Vec<_> = ops.iter().map(host_side).collect();
        got.sort();
        assert_eq!(got, want, "{knob}: the host side of the rows");
    }
}

#[test]
fn exit_while_another_thread_issues_ops() {
    // The program exits while a thread is in the middle of its ops: the exit is
    // bounded, the process row is written, and what it counts agrees with the rows
    // (the writer counts timing outcomes from the rows it receives: a call in flight
    // at exit pushes its row after the writer's last drain and is in neither).
    for i in 0..3 {
        let run = Run::new("adv-exit-busy");
        run_driver(
            &run,
            &["exit_busy", "2000"],
            &[("ZCTA_BUDGET", "all"), ("FAKE_CUDA_KERNEL_NS", "5000")],
            LIMIT,
        );
        let (p, ops, t) = counts_agree(&run);
        assert!(ops.len() >= 2000, "run {i}: {}", ops.len());
        assert!(t.n("timed") > 0, "run {i}: {:?} {p:?}", t.by_timing);
    }
}

#[test]
fn a_simulated_group_is_not_timed() {
    // ncclGroupSimulateEnd launches nothing: no stamp goes into the program's stream,
    // and its op has no GPU span.
    let run = Run::new("adv-simulate");
    let stats_path = run.scratch("cuda-stats");
    let mut c = run.host(&["simulate"]);
    c.env("HOST_CUDA", cuda())
        .env("FAKE_CUDA_STATS_FILE", &stats_path)
        .env("ZCTA_BUDGET", "all");
    let out = bounded(c, LIMIT);
    assert!(out.status.success() && out.stderr.is_empty(), "{out:?}");
    let (p, ops, t) = counts_agree(&run);
    assert_eq!(ops.len(), 1);
    assert_eq!(t.n("off"), 1, "{:?}", t.by_timing);
    assert_eq!(p.u64("ops_timed"), Some(0), "{p:?}");
    let stats = common::read_cuda_stats(&stats_path);
    assert!(stats["stamps"].is_multiple_of(3), "anchors only: {stats:?}");
    assert_eq!(stats["stamps_failed"], 0, "{stats:?}");
}

#[test]
fn a_driver_loaded_after_the_first_communicator() {
    // The program's first CUDA use comes after its first communicator: the ops of the
    // next communicator are timed (the driver is looked up again), the first's not.
    let run = Run::new("adv-late-cuda");
    let stats_path = run.scratch("cuda-stats");
    let mut c = run.host(&["late_cuda", &cuda()]);
    c.env("FAKE_CUDA_STATS_FILE", &stats_path)
        .env("ZCTA_BUDGET", "all");
    let out = bounded(c, LIMIT);
    assert!(out.status.success() && out.stderr.is_empty(), "{out:?}");
    assert_eq!(text(&out.stdout), "ok\n");
    let (p, ops, t) = counts_agree(&run);
    assert_eq!(ops.len(), 4);
    assert_eq!((t.n("off"), t.n("timed")), (1, 3), "{:?} {p:?}", t.by_timing);
    assert_eq!(t.timed_without_times, 0);
}

#[test]
fn calls_a_non_blocking_communicator_accepts_are_in_progress() {
    // ncclInProgress: NCCL launches the work after the call returns, so the stamps
    // around the call cannot time it. Not an error, and no row claims a GPU time.
    let run = Run::new("adv-in-progress");
    let mut c = run.host(&["inprogress", "20"]);
    c.env("HOST_CUDA", cuda())
        .env("FAKE_NCCL_IN_PROGRESS", "1")
        .env("ZCTA_BUDGET", "all");
    let out = bounded(c, LIMIT);
    assert!(out.status.success(), "{out:?}");
    assert!(out.stderr.is_empty(), "{}", text(&out.stderr));
    let ops = run.rows("ops");
    assert_eq!(ops.len(), 20, "{ops:?}");
    for o in &ops {
        assert_eq!(o.req_i32("result"), 7);
        assert_eq!(o.str("timing"), Some("in_progress"), "{o:?}");
        assert!(o.is_null("gpu_end_ns") && o.is_null("gpu_ready_ns"), "{o:?}");
    }
    let p = &run.rows("process")[0];
    assert_eq!(p.u64("timing_errors"), Some(0), "{p:?}");
}

#[test]
fn a_first_communicator_made_during_another_threads_capture() {
    // Loading the stamp kernel and pinning its slots are unsafe calls during a capture
    // (the stand-in invalidates a global-mode capture of another thread, as the driver
    // does): zcta makes them at the communicator's creation, in relaxed capture mode,
    // never on the hot path.
    let run = Run::new("adv-capfirst");
    let (_, stats) = run_driver(&run, &["capture_first"], &[("ZCTA_BUDGET", "all")], LIMIT);
    assert_eq!(stats["captures_invalidated"], 0, "{stats:?}");
    assert_eq!(stats["unsafe_during_capture"], 0, "{stats:?}");
    assert_eq!((stats["modules"], stats["host_allocs"]), (2, 1), "{stats:?}");
    let ops = run.rows("ops");
    assert_eq!(ops.len(), 1);
    assert_eq!(
        ops[0].str("timing"),
        Some("timed"),
        "made at the creation: {:?}",
        ops[0]
    );
}

#[test]
fn a_device_reset_with_stamps_queued() {
    // A device reset (as cudaDeviceReset) drops the queued stamps and ends the slots'
    // registration while the writer may still read them: they are zcta's own memory,
    // so nothing crashes; the op whose stamps never ran is lost, not invented.
    // `id_fail`: the driver cannot tell contexts apart (no cuCtxGetId).
    for (phase2, id_fail) in [("0", "0"), ("1", "0"), ("1", "1")] {
        let run = Run::new(&format!("adv-reset{phase2}{id_fail}"));
        run_driver(
            &run,
            &["reset_between", phase2],
            &[("ZCTA_BUDGET", "all"), ("FAKE_CUDA_CTX_ID_FAIL", id_fail)],
            LIMIT,
        );
        let mut ops = run.rows("ops");
        ops.sort_by_key(|o| o.i64("op_id"));
        assert_eq!(ops.len(), if phase2 == "1" { 11 } else { 6 }, "{phase2}");
        // What was read before the reset is kept; the rest (stamps dropped with the
        // reset, or no anchor left to place them) is counted lost, never made up.
        // The new context has the old one's handle but another id: its ops get a
        // stamp kernel and slots of their own, and are timed again. Without ids the
        // old context's stamper is used and refused (its slots are no longer
        // registered): errors, not crashes.
        if phase2 == "1" {
            for o in &ops[6..] {
                if id_fail == "1" {
                    assert_eq!(o.str("timing"), Some("error"), "{o:?}");
                } else {
                    assert_eq!(o.str("timing"), Some("timed"), "{o:?}");
                    assert!(o.i64("gpu_end_ns").is_some(), "after the reset: {o:?}");
                }
            }
        }
        let with_times = ops.iter().filter(|o| o.i64("gpu_end_ns").is_some()).count() as u64;
        for o in &ops {
            if let (Some(r), Some(e)) = (o.i64("gpu_ready_ns"), o.i64("gpu_end_ns")) {
                assert!(r <= e, "{o:?}");
            }
        }
        let timed = ops.iter().filter(|o| o.str("timing") == Some("timed")).count() as u64;
        let p = &run.rows("process")[0];
        assert_eq!(
            timed,
            with_times + p.u64("ops_timing_lost").unwrap_or(0),
            "{p:?} {ops:?}"
        );
        assert!(
            ops[..6].iter().filter(|o| o.i64("gpu_end_ns").is_some()).count() < 6,
            "the sixth op's stamps never ran: {ops:?}"
        );
    }
}

/// The timed ops of a run that got GPU times, each with its ready time's truth: in the
/// stand-in a ready stamp on an idle stream (every op's work takes 1 ns) is written at
/// its launch, which the shim makes inside its call, between the previous call's
/// `api_end_ns` on that thread and this call's `api_start_ns`. Returns, per op, how far
/// `gpu_ready_ns` lies outside that interval (0 inside).
fn ready_outside_truth(ops: &[Row]) -> Vec<(i64, &Row)> {
    let mut by_tid: BTreeMap<u64, Vec<&Row>> = BTreeMap::new();
    for o in ops.iter().filter(|o| o.u64("group_id").is_none()) {
        by_tid.entry(o.req_u64("tid")).or_default().push(o);
    }
    let mut out = Vec::new();
    for v in by_tid.values_mut() {
        v.sort_by_key(|o| o.req_i64("api_start_ns"));
        for w in v.windows(2) {
            let Some(ready) = w[1].i64("gpu_ready_ns") else {
                continue;
            };
            let (lo, hi) = (w[0].req_i64("api_end_ns"), w[1].req_i64("api_start_ns"));
            let off = if ready < lo {
                lo - ready
            } else if ready > hi {
                ready - hi
            } else {
                0
            };
            out.push((off, w[1]));
        }
    }
    out
}

#[test]
fn an_anchor_kernel_that_always_gives_up_still_leaves_ops_their_times() {
    // The anchor kernel gives up as soon as it runs (FAKE_CUDA_ANCHOR_WAIT_NS=0): as on
    // a machine whose writer thread is always held past the kernel's 1 ms wait (a
    // loaded host: one yield of the writer between the kernel's mark and its release
    // can cost that much). Its 1 is never a GPU time; stamps, which need no handshake,
    // still work on that GPU, so the clock must still be anchored (with stamps), and
    // the timed ops must get times, placed where they ran.
    let run = Run::new("adv-anchor-gives-up");
    let (_, stats) = run_driver(
        &run,
        &["threads", "1", "200"],
        &[
            ("ZCTA_BUDGET", "all"),
            ("HOST_ITER_GAP_MS", "2"),
            ("FAKE_CUDA_KERNEL_NS", "1"),
            ("FAKE_CUDA_ANCHOR_WAIT_NS", "0"),
        ],
        Duration::from_secs(30),
    );
    assert!(stats["anchors_gave_up"] > 0, "{stats:?}");
    let (p, ops, t) = counts_agree(&run);
    // Whatever times there are, none comes from a given-up kernel's 1: each lies near
    // its call (a GPU time of 1 put on the host clock is decades off).
    for o in &ops {
        if let Some(r) = o.i64("gpu_ready_ns") {
            let off = (r - o.req_i64("api_start_ns")).abs();
            assert!(off < 1_000_000_000, "a GPU time {off} ns off its call: {o:?}");
        }
    }
    assert!(t.n("timed") > 100, "{:?}", t.by_timing);
    assert_eq!(
        t.timed_without_times, 0,
        "every timed op lost for want of an anchor, though stamps run: {p:?} {stats:?}"
    );
    assert!(!p.is_null("gpu_clock_error_ns"), "{p:?}");
}

#[test]
fn gpu_times_lie_within_the_claimed_error_of_the_truth() {
    // The stand-in's GPU clock is CLOCK_REALTIME plus an offset, so where a ready stamp
    // ran is known (`ready_outside_truth`); the row's gpu_clock_error_ns must cover how
    // far it is placed from there (no drift here; 20 µs for the host clock's own
    // reading). With a GPU clock far from the host's either way, with the anchor
    // kernel's stores reaching the host late (a bracket that is all on one side of its
    // GPU time), with an anchor kernel slow to start, and with stamps for anchors.
    // With a drifting clock too, where anchors late by the same amount hide part of
    // the drift from their difference (2 % and 100 ppm, each anchor 300 µs late): the
    // row's error takes the most drift the anchors allow, not the least. With a timer
    // running at half speed and times placed from one anchor (a 10 ms hold): the
    // drift's bound is per second of the GPU's timer, over which distances are taken.
    for knobs in [
        &[("FAKE_CUDA_CLOCK_PPM", "-500000"), ("ZCTA_GPU_HOLD_MS", "10")][..],
        &[
            ("FAKE_CUDA_CLOCK_PPM", "20000"),
            ("FAKE_CUDA_ANCHOR_LAG_NS", "300000"),
        ],
        &[
            ("FAKE_CUDA_CLOCK_PPM", "100"),
            ("FAKE_CUDA_ANCHOR_LAG_NS", "300000"),
        ],
        &[("FAKE_CUDA_CLOCK_OFFSET_NS", "-1000000000000000000")],
        &[("FAKE_CUDA_CLOCK_OFFSET_NS", "3600000000000")],
        &[("FAKE_CUDA_ANCHOR_LAG_NS", "300000")],
        &[("FAKE_CUDA_ANCHOR_START_NS", "1500000")],
        &[("FAKE_CUDA_NO_ANCHOR", "1")],
    ] {
        let run = Run::new("adv-anchor-truth");
        let mut env = vec![
            ("ZCTA_BUDGET", "all"),
            ("HOST_ITER_GAP_MS", "1"),
            ("FAKE_CUDA_KERNEL_NS", "1"),
        ];
        env.extend_from_slice(knobs);
        run_driver(&run, &["threads", "1", "600"], &env, Duration::from_secs(30));
        let (p, ops, t) = counts_agree(&run);
        assert_eq!(t.timed_without_times, 0, "{knobs:?}: {p:?}");
        let err = p.req_i64("gpu_clock_error_ns");
        let offs = ready_outside_truth(&ops);
        assert!(offs.len() > 500, "{knobs:?}: {}", offs.len());
        let (worst, o) = offs.iter().max_by_key(|x| x.0).unwrap();
        assert!(
            *worst <= err + 20_000,
            "{knobs:?}: a ready time {worst} ns from where it ran, the row claims {err}: {o:?} {p:?}"
        );
    }
}

#[test]
fn a_clock_anchored_only_once_claims_no_error_it_cannot_bound() {
    // The clock is anchored early in the run and never again (every later launch of an
    // anchor fails), on a timer 2 % fast: the times placed from that one anchor carry
    // a drift the run never measured, milliseconds by the end. The process row says
    // so — its error and drift NULL, not the anchor's own microseconds — and every
    // timed op still has its times.
    let run = Run::new("adv-anchor-once");
    run_driver(
        &run,
        &["threads", "1", "600"],
        &[
            ("ZCTA_BUDGET", "all"),
            ("HOST_ITER_GAP_MS", "1"),
            ("FAKE_CUDA_KERNEL_NS", "1"),
            ("FAKE_CUDA_CLOCK_PPM", "20000"),
            ("FAKE_CUDA_ANCHORS_FOR_NS", "200000000"),
        ],
        Duration::from_secs(30),
    );
    let (p, ops, t) = counts_agree(&run);
    assert_eq!(t.timed_without_times, 0, "{p:?}");
    assert!(t.n("timed") > 500, "{:?}", t.by_timing);
    assert!(
        p.is_null("gpu_clock_error_ns") && p.is_null("gpu_clock_drift_ns_per_s"),
        "{p:?}"
    );
    let worst = ready_outside_truth(&ops).iter().map(|x| x.0).max().unwrap();
    assert!(worst > 1_000_000, "the drift shows: {worst} ns {p:?}");
}

#[test]
fn exit_and_fork_while_the_writer_waits_for_an_anchor_kernel() {
    // The anchor kernel starts 1.9 ms after its launch (the writer waits most of its
    // 2 ms for each of its tries), or never within the run (each try waits the full
    // 2 ms; the kernels are still queued at exit). The program exits from its main
    // thread while another issues ops, or forks while stamps are in flight: every
    // exit is bounded, nothing reaches stderr, every row is written and counted.
    for start in ["1900000", "60000000000"] {
        let knobs = [("ZCTA_BUDGET", "all"), ("FAKE_CUDA_ANCHOR_START_NS", start)];
        for _ in 0..2 {
            let run = Run::new("adv-anchor-exit");
            let t0 = Instant::now();
            let env = [knobs[0], knobs[1], ("FAKE_CUDA_KERNEL_NS", "5000")];
            run_driver(&run, &["exit_busy", "3000"], &env, LIMIT);
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "{start}: exit took {:?}",
                t0.elapsed()
            );
            let (p, ops, t) = counts_agree(&run);
            assert!(ops.len() >= 3000, "{start}: {}", ops.len());
            assert!(t.n("timed") > 0, "{start}: {:?} {p:?}", t.by_timing);
        }
        let run = Run::new("adv-anchor-fork");
        let env = [knobs[0], knobs[1], ("FAKE_CUDA_KERNEL_NS", "2000000")];
        run_driver(&run, &["fork_busy", "40"], &env, LIMIT);
        let (_, ops, t) = counts_agree(&run);
        assert_eq!(ops.len(), 1 + 40 + 3, "{start}");
        assert_eq!(t.n("error"), 0, "{start}: {:?}", t.by_timing);
        // A run of ops spread over more than a second, ended by a normal exit.
        let run = Run::new("adv-anchor-exit-normal");
        let env = [knobs[0], knobs[1], ("HOST_ITER_GAP_MS", "10")];
        let t0 = Instant::now();
        run_driver(&run, &["threads", "2", "100"], &env, LIMIT);
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "{start}: took {:?}",
            t0.elapsed()
        );
        let (p, ops, t) = counts_agree(&run);
        assert_eq!(ops.len(), 200);
        if start == "1900000" {
            assert_eq!(t.timed_without_times, 0, "{start}: {p:?}");
        }
    }
}

#[test]
fn a_device_reset_while_anchor_kernels_wait() {
    // Anchor kernels start 1.5 ms after their launch, so at the reset one may be
    // waiting (the reset ends it: it writes nothing). Afterwards the new context (same
    // handle, new id) is anchored anew and its ops are timed, placed where they ran.
    for _ in 0..3 {
        let run = Run::new("adv-anchor-reset");
        run_driver(
            &run,
            &["reset_between", "1"],
            &[("ZCTA_BUDGET", "all"), ("FAKE_CUDA_ANCHOR_START_NS", "1500000")],
            LIMIT,
        );
        let mut ops = run.rows("ops");
        ops.sort_by_key(|o| o.i64("op_id"));
        assert_eq!(ops.len(), 11);
        let p = &run.rows("process")[0];
        // NULL where neither context got a second anchor (the old one is gone; the
        // new one's at the exit may not answer within its tries, its kernel starting
        // 1.5 ms late): the drift of their times was not measured. The stand-in's
        // timer has none, so the times still lie where they ran.
        let err = p.i64("gpu_clock_error_ns").unwrap_or(0);
        for o in &ops[6..] {
            assert_eq!(o.str("timing"), Some("timed"), "{o:?}");
            let r = o
                .i64("gpu_ready_ns")
                .unwrap_or_else(|| panic!("after the reset: {o:?} {p:?}"));
            // Its stream was idle: its ready stamp ran at its call.
            let off = (r - o.req_i64("api_start_ns")).abs();
            assert!(off <= err + 1_000_000, "{off} ns off (claimed {err}): {o:?}");
        }
    }
}

#[test]
fn long_mixed_groups_select_the_ops_every_rank_would() {
    // At a budget level above 0 an op inside a group is chosen by its key, a hash of
    // its communicator, ranks and the sequence number it will take at the group's
    // end; past 32 ops the ops ahead of it on its counter are counted as the group
    // grows. Groups of 200 and 1,000 Sends, Recvs and AllReduces to pseudo-random
    // peers on two communicators over two streams, at a budget (10 %) whose level
    // lands at 5-8 here: every op the shim chose (NCCL
    // generated its API event, so its row has graph_captured) must have, from its
    // row's comm_id, rank, peer and seq (what the peer rank computes), a key chosen
    // at the level of the ungrouped ops around its group.
    for (glen, iters) in [("200", "300"), ("1000", "300")] {
        let run = Run::new("adv-mixed-groups");
        run_driver(
            &run,
            &["mixed_groups", iters, glen, "100", "4000"],
            &[("ZCTA_BUDGET", "10%")],
            Duration::from_secs(60),
        );
        let ops = run.rows("ops");
        let mut ungrouped: Vec<&Row> = ops.iter().filter(|o| o.is_null("group_id")).collect();
        ungrouped.sort_by_key(|o| o.req_i64("api_start_ns"));
        let mut groups: BTreeMap<u64, Vec<&Row>> = BTreeMap::new();
        for o in ops.iter() {
            if let Some(g) = o.u64("group_id") {
                groups.entry(g).or_default().push(o);
            }
        }
        let (mut checked, mut chosen, mut wrong) = (0, 0, Vec::new());
        for (g, rows) in &groups {
            let first = rows.iter().map(|o| o.req_i64("api_start_ns")).min().unwrap();
            let i = ungrouped.partition_point(|o| o.req_i64("api_start_ns") < first);
            let level_at = |j: Option<usize>| j.and_then(|j| ungrouped.get(j)?.u64("timing_level"));
            // The level moves at most every 250 ms: the same on both sides, it held
            // through the group.
            let (Some(before), Some(after)) = (level_at(i.checked_sub(1)), level_at(Some(i))) else {
                continue;
            };
            if before != after || before == 0 {
                continue;
            }
            checked += 1;
            for o in rows.iter().filter(|o| !o.is_null("graph_captured")) {
                chosen += 1;
                let (comm, seq, rank) = (o.req_u64("comm_id"), o.req_u64("seq"), o.req_i64("rank") as i32);
                let key = match (o.req_str("op"), o.i64("peer")) {
                    ("Send", Some(p)) => zcta::budget::p2p_key(comm, rank, p as i32, seq),
                    ("Recv", Some(p)) => zcta::budget::p2p_key(comm, p as i32, rank, seq),
                    _ => zcta::budget::coll_key(comm, seq),
                };
                if u64::from(key.trailing_zeros()) < before {
                    wrong.push((*g, o.req_u64("op_id"), before, key.trailing_zeros()));
                }
            }
        }
        let captured = ops.iter().filter(|o| !o.is_null("graph_captured")).count();
        let levels: BTreeMap<u64, usize> = ungrouped.iter().fold(BTreeMap::new(), |mut m, o| {
            *m.entry(o.u64("timing_level").unwrap_or(99)).or_default() += 1;
            m
        });
        eprintln!("glen {glen}: checked {checked} chosen {chosen} captured {captured} levels {levels:?}");
        assert!(checked >= 10, "glen {glen}: {checked} groups at a level above 0");
        assert!(chosen >= 20, "glen {glen}: {chosen} ops chosen in them");
        assert!(
            wrong.is_empty(),
            "glen {glen}: {} of {chosen} ops chosen whose row's key is not chosen at the level (group, op_id, level, trailing zeros; the first 10): {:?}",
            wrong.len(),
            &wrong[..wrong.len().min(10)]
        );
    }
}
