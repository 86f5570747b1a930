//! GPU capture through CUPTI, driven on the CPU: the stand-in NCCL makes the stand-in
//! libcupti (tests/fixtures/fake_cupti.c, CUPTI 13.0 layouts) call the API callback
//! and emit the records real CUPTI does for NCCL launches, copy-engine copies,
//! proxy-thread copies and the program's own kernels; the shim must join them to ops,
//! or back off cleanly.

mod common;
mod support;

use std::collections::BTreeMap;
use std::process::{Output, Stdio};

use support::{Row, Run, text};

fn cupti() -> String {
    common::fixtures().libcupti.display().to_string()
}

/// `ops 0 1 ID ITERS` under the shim with extra env.
fn ops_run(run: &Run, iters: u32, env: &[(&str, &str)]) -> Output {
    let idf = run.scratch("id");
    common::write_unique_id(&idf);
    let mut c = run.host(&["ops", "0", "1", idf.to_str().unwrap(), &iters.to_string()]);
    c.envs(env.iter().copied());
    let out = c.output().unwrap();
    assert!(out.status.success(), "{out:?}");
    out
}

fn process(run: &Run) -> Row {
    let mut p = run.rows("process");
    assert_eq!(p.len(), 1);
    p.remove(0)
}

/// `zcta SUBCOMMAND RUN_DIR`.
fn zcta_on(subcommand: &str, run: &Run) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_zcta"))
        .arg(subcommand)
        .arg(run.dir())
        .output()
        .unwrap()
}

fn zcta_lines(out: &Output) -> Vec<String> {
    text(&out.stderr).lines().map(str::to_owned).collect()
}

#[test]
fn every_op_gets_its_kernel_through_its_launch_call() {
    let run = Run::new("gpu-default");
    let out = ops_run(&run, 3, &[("HOST_CUPTI", &cupti()), ("ZCTA_GPU", "deep")]);
    assert!(out.stderr.is_empty(), "{}", text(&out.stderr));
    let p = process(&run);
    assert_eq!(p.str("cupti"), Some("on"));
    assert_eq!(p.str("cupti_lib"), Some(cupti().as_str()));
    assert_eq!(p.str("gpu_clock"), Some("CLOCK_REALTIME"));
    assert_eq!(p.u64("cupti_dropped"), Some(0));
    assert_eq!(p.u64("ops_without_gpu"), Some(0));

    let ops = run.rows("ops");
    assert_eq!(ops.len(), 3 * 11);
    for o in &ops {
        let op = o.req_str("op");
        assert_eq!(o.str("engine"), Some("sm_kernel"), "{op}");
        let (s, e, l) = (
            o.req_i64("gpu_start_ns"),
            o.req_i64("gpu_end_ns"),
            o.req_i64("launch_ns"),
        );
        assert!(l <= s && s < e, "{op}: launch {l} start {s} end {e}");
        assert!(o.req_i64("api_start_ns") <= l, "{op}: launched before the call");
        assert_eq!(o.u64("n_kernels"), Some(1), "{op}");
        let want = match op {
            "Send" | "Recv" => "ncclDevKernel_SendRecv".to_string(),
            "Bcast" => "ncclDevKernel_Broadcast".to_string(),
            _ => format!("ncclDevKernel_{op}"),
        };
        assert_eq!(o.str("kernel"), Some(want.as_str()), "{op}");
    }
    // The summary shows the GPU side per op.
    let sum = text(&zcta_on("summary", &run).stdout);
    assert!(
        sum.contains("GPU side (GPU stamps by default, CUPTI in deep mode)"),
        "{sum}"
    );
    assert!(sum.lines().any(|l| l.trim() == "CUPTI: on"), "{sum}");
    let line = sum
        .lines()
        .find(|l| l.trim_start().starts_with("AllReduce ") && l.contains("GPU median"))
        .unwrap();
    assert!(line.contains("sm_kernel 3") && line.contains(" us"), "{line}");
    assert!(line.contains("measured       3 of 3 "), "{line}");
    // One kernel per launch: 9 ungrouped ops and one group per iteration.
    let gpu = run.rows("gpu");
    assert_eq!(gpu.len(), 3 * 10);
    assert_eq!(p.u64("gpu_rows"), Some(30));
    let by_id: BTreeMap<u64, &Row> = ops.iter().map(|o| (o.req_u64("op_id"), o)).collect();
    for g in &gpu {
        assert_eq!(g.str("attribution"), Some("nccl_call"));
        assert_eq!(g.str("kind"), Some("kernel"));
        assert_eq!(g.i32("grid_x"), Some(2));
        match (g.u64("op_id"), g.u64("group_id")) {
            (Some(id), None) => {
                let o = by_id[&id];
                assert_eq!(o.req_i64("gpu_start_ns"), g.req_i64("start_ns"));
                assert_eq!(o.req_i64("launch_ns"), g.req_i64("launch_ns"));
            }
            (None, Some(gid)) => {
                let members: Vec<_> = ops.iter().filter(|o| o.u64("group_id") == Some(gid)).collect();
                assert_eq!(members.len(), 2, "Send and Recv share the group's kernel");
                for o in members {
                    assert_eq!(o.req_i64("gpu_end_ns"), g.req_i64("end_ns"));
                }
            }
            other => panic!("gpu row names {other:?}"),
        }
    }
}

#[test]
fn copy_engine_collectives_have_no_kernel() {
    let run = Run::new("gpu-ce");
    ops_run(
        &run,
        2,
        &[
            ("HOST_CUPTI", &cupti()),
            ("ZCTA_GPU", "deep"),
            ("FAKE_CUPTI_CE", "1"),
        ],
    );
    for o in run.rows("ops") {
        let op = o.req_str("op");
        if op == "AlltoAll" || op == "AllGather" {
            assert_eq!(o.str("engine"), Some("copy_engine"), "{op}");
            assert_eq!(o.u64("n_kernels"), Some(0));
            assert_eq!(o.u64("n_memcpy"), Some(2));
            assert_eq!(o.u64("memcpy_bytes"), Some(1 << 20));
            assert!(o.is_null("kernel"));
            assert!(!o.is_null("gpu_start_ns") && !o.is_null("launch_ns"));
        } else {
            assert_eq!(o.str("engine"), Some("sm_kernel"), "{op}");
        }
    }
    let copies: Vec<_> = run
        .rows("gpu")
        .into_iter()
        .filter(|g| g.str("kind") == Some("memcpy"))
        .collect();
    assert_eq!(copies.len(), 2 * 2 * 2);
    let kinds: Vec<_> = copies
        .iter()
        .map(|g| g.req_str("copy_kind").to_string())
        .collect();
    assert_eq!(kinds.iter().filter(|k| *k == "DtoD").count(), 4);
    assert_eq!(kinds.iter().filter(|k| *k == "PtoP").count(), 4);
    assert!(
        copies
            .iter()
            .filter(|g| g.str("copy_kind") == Some("PtoP"))
            .all(|g| g.u64("dst_device") == Some(1))
    );
}

#[test]
fn proxy_thread_copies_are_attributed_to_the_running_op() {
    let run = Run::new("gpu-proxy");
    let idf = run.scratch("id");
    common::write_unique_id(&idf);
    let children: Vec<_> = ["0", "1"]
        .iter()
        .map(|r| {
            let mut c = run.host(&["plugin", r, "2", idf.to_str().unwrap(), "3"]);
            c.envs([
                ("HOST_CUPTI", cupti().as_str()),
                ("ZCTA_GPU", "deep"),
                ("FAKE_NCCL_PROXY", "1"),
                ("FAKE_CUPTI_PROXY_COPY", "1"),
                ("FAKE_CUPTI_KERNEL_NS", "200000000"),
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
            c.spawn().unwrap()
        })
        .collect();
    for c in children {
        let out = c.wait_with_output().unwrap();
        assert!(out.status.success() && out.stderr.is_empty(), "{out:?}");
    }
    let gpu = run.rows("gpu");
    let copies: Vec<_> = gpu.iter().filter(|g| g.str("kind") == Some("memcpy")).collect();
    assert!(!copies.is_empty(), "no proxy copies recorded");
    let ops = run.rows("ops");
    let op_of: BTreeMap<(i32, u64), &Row> = ops
        .iter()
        .map(|o| ((o.req_i32("pid"), o.req_u64("op_id")), o))
        .collect();
    for c in &copies {
        assert_eq!(c.str("attribution"), Some("proxy_window"));
        assert!(c.u64("api_thread").is_some());
        // Proxy copies are given to the op (or group) whose kernel was running.
        let pid = c.req_i32("pid");
        match (c.u64("op_id"), c.u64("group_id")) {
            (Some(id), g) => assert_eq!(op_of[&(pid, id)].u64("group_id"), g),
            (None, Some(g)) => assert!(
                ops.iter()
                    .any(|o| o.req_i32("pid") == pid && o.u64("group_id") == Some(g))
            ),
            other => panic!("copy attributed to {other:?}"),
        }
    }
    assert!(ops.iter().any(|o| o.str("engine") == Some("proxy_memcpy")));
    let n_copies: u64 = ops
        .iter()
        .filter(|o| o.is_null("group_id"))
        .map(|o| o.req_u64("n_memcpy"))
        .sum();
    let grouped: u64 = copies.iter().filter(|c| c.u64("group_id").is_some()).count() as u64;
    assert_eq!(n_copies + grouped, copies.len() as u64);
}

#[test]
fn zcta_cupti_lib_is_loaded_when_none_is_mapped() {
    let run = Run::new("gpu-lib");
    let out = ops_run(&run, 1, &[("ZCTA_CUPTI_LIB", &cupti()), ("ZCTA_GPU", "deep")]);
    assert!(out.stderr.is_empty(), "{}", text(&out.stderr));
    let p = process(&run);
    assert_eq!(p.str("cupti"), Some("on"));
    assert_eq!(p.str("cupti_lib"), Some(cupti().as_str()));
    assert!(
        run.rows("ops")
            .iter()
            .all(|o| o.str("engine") == Some("sm_kernel"))
    );
}

#[test]
fn without_cupti_rows_are_host_only_and_say_why() {
    for (id, env, why) in [
        (
            "no-lib",
            vec![("ZCTA_GPU", "deep".into())],
            "off: libcupti not found",
        ),
        (
            "events",
            vec![("HOST_CUPTI", cupti())],
            "off: CUPTI is used in deep mode only",
        ),
        (
            "off",
            vec![
                ("HOST_CUPTI", cupti()),
                ("ZCTA_GPU", "deep".into()),
                ("ZCTA_CUPTI", "0".into()),
            ],
            "off: ZCTA_CUPTI=0",
        ),
    ] {
        let run = Run::new(id);
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let out = ops_run(&run, 1, &env);
        // No CUDA driver in this process: missing CUPTI is not worth a warning.
        assert!(out.stderr.is_empty(), "{id}: {}", text(&out.stderr));
        let p = process(&run);
        assert!(p.req_str("cupti").starts_with(why), "{id}: {:?}", p.str("cupti"));
        assert!(p.is_null("gpu_rows") && p.is_null("cupti_dropped"));
        for o in run.rows("ops") {
            for col in [
                "engine",
                "gpu_start_ns",
                "gpu_end_ns",
                "launch_ns",
                "n_kernels",
                "n_memcpy",
            ] {
                assert!(o.is_null(col), "{id}: {col} should be NULL (not measured)");
            }
        }
        assert!(!run.dir().join("gpu").exists(), "{id}: gpu table without CUPTI");
    }
}

#[test]
fn cupti_it_cannot_trust_is_declined_with_one_warning() {
    for (id, env, why) in [
        (
            "subscribed",
            ("FAKE_CUPTI_SUBSCRIBED", "1"),
            "off: another CUPTI client holds CUPTI",
        ),
        (
            "clock",
            ("FAKE_CUPTI_CLOCK_OFFSET", "5000000000"),
            "off: CUPTI's clock is not CLOCK_REALTIME",
        ),
        (
            "version",
            ("FAKE_CUPTI_VERSION", "120000"),
            "off: CUPTI API version 120000 is older",
        ),
    ] {
        let run = Run::new(id);
        let out = ops_run(&run, 1, &[("HOST_CUPTI", &cupti()), ("ZCTA_GPU", "deep"), env]);
        let lines = zcta_lines(&out);
        assert_eq!(lines.len(), 1, "{id}: {lines:?}");
        assert!(
            lines[0].starts_with("zcta: ") && lines[0].contains("host-side only"),
            "{id}: {lines:?}"
        );
        let p = process(&run);
        assert!(p.req_str("cupti").starts_with(why), "{id}: {:?}", p.str("cupti"));
        assert!(run.rows("ops").iter().all(|o| o.is_null("engine")));
    }
}

#[test]
fn a_profiler_arriving_later_gets_cupti_and_its_data() {
    let run = Run::new("kineto");
    let mut c = run.host(&["kineto", "4"]);
    c.env("HOST_CUPTI", cupti()).env("ZCTA_GPU", "deep");
    let out = c.output().unwrap();
    assert!(out.status.success(), "{out:?}");
    // The newcomer's kernels reach the newcomer.
    assert!(
        text(&out.stdout).contains("ok kineto_kernels=4"),
        "{}",
        text(&out.stdout)
    );
    let lines = zcta_lines(&out);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains("called cuptiSubscribe"), "{lines:?}");
    let p = process(&run);
    assert!(
        p.req_str("cupti").starts_with("stopped: "),
        "{:?}",
        p.str("cupti")
    );
    assert_eq!(
        p.u64("gpu_foreign"),
        Some(1),
        "the program's own kernel is dropped"
    );
    let mut ops = run.rows("ops");
    ops.sort_by_key(|o| o.req_u64("op_id"));
    assert_eq!(ops.len(), 8);
    for o in &ops[..4] {
        assert_eq!(
            o.str("engine"),
            Some("sm_kernel"),
            "before the profiler: measured"
        );
    }
    for o in &ops[4..] {
        assert!(o.is_null("engine"), "after the profiler took CUPTI: not measured");
    }
    assert_eq!(run.rows("gpu").len(), 4);
}

/// `zcta export --perfetto` writes valid Chrome trace-event JSON: every event has the
/// fields its phase needs, every process and track is named, and every op and GPU
/// activity is there.
#[test]
fn perfetto_trace_is_valid_trace_event_json() {
    let run = Run::new("trace");
    ops_run(&run, 2, &[("HOST_CUPTI", &cupti()), ("ZCTA_GPU", "deep")]);
    let out = run.scratch("trace.json");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_zcta"))
        .args(["export", "--perfetto"])
        .arg(run.dir())
        .arg("-o")
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    let ev = v["traceEvents"].as_array().unwrap();
    let mut named_proc = std::collections::BTreeSet::new();
    let mut named_thread = std::collections::BTreeSet::new();
    let mut cats: BTreeMap<String, usize> = BTreeMap::new();
    for e in ev {
        let ph = e["ph"].as_str().unwrap();
        assert!(e["name"].is_string(), "{e}");
        let (pid, tid) = (e["pid"].as_i64().unwrap(), e["tid"].as_i64().unwrap());
        match ph {
            "M" => match e["name"].as_str().unwrap() {
                "process_name" => {
                    named_proc.insert(pid);
                }
                "thread_name" => {
                    named_thread.insert((pid, tid));
                }
                "process_sort_index" => {}
                other => panic!("metadata {other}"),
            },
            "X" => {
                assert!(e["ts"].as_f64().unwrap() >= 0.0, "{e}");
                assert!(e["dur"].as_f64().unwrap() >= 0.0, "{e}");
                *cats.entry(e["cat"].as_str().unwrap().to_owned()).or_default() += 1;
            }
            other => panic!("phase {other}"),
        }
    }
    for e in ev.iter().filter(|e| e["ph"] == "X") {
        let (pid, tid) = (e["pid"].as_i64().unwrap(), e["tid"].as_i64().unwrap());
        assert!(
            named_proc.contains(&pid) && named_thread.contains(&(pid, tid)),
            "{e}"
        );
    }
    assert_eq!(cats.get("nccl").copied(), Some(run.rows("ops").len()));
    assert_eq!(cats.get("gpu").copied(), Some(run.rows("gpu").len()));
    let first = ev.iter().find(|e| e["cat"] == "nccl").unwrap();
    assert!(
        first["name"].as_str().unwrap().starts_with("AllReduce 4 KiB #0"),
        "{first}"
    );
}

/// `ops.gpu_ready_ns` in deep mode: from the CUDA events around the ops zcta times
/// (with the stand-in driver and `ZCTA_BUDGET=all`, every op); CUPTI's records give
/// the kernel span, never when the stream was free. Without events it is NULL, never
/// a guess, and the report says why. The setting that once asked CUPTI for it is
/// named when set.
#[test]
fn each_op_says_when_its_stream_was_free() {
    let run = Run::new("ready");
    let mut c = run.host(&["window"]);
    c.env("HOST_CUPTI", cupti())
        .env("HOST_CUDA", common::fixtures().libcuda.display().to_string())
        .env("ZCTA_GPU", "deep")
        .env("ZCTA_BUDGET", "all");
    let out = c.output().unwrap();
    assert!(out.status.success() && out.stderr.is_empty(), "{out:?}");
    assert_eq!(process(&run).str("cupti"), Some("on"));
    let report = text(&zcta_on("report", &run).stdout);
    assert!(!report.contains("Queue and sync not split"), "{report}");
    let ops = run.rows("ops");
    assert_eq!(ops.len(), 3);
    for o in &ops {
        assert_eq!(o.str("timing"), Some("timed"), "{o:?}");
        assert!(
            o.i64("gpu_ready_ns").is_some() && o.i64("gpu_start_ns").is_some(),
            "{o:?}"
        );
    }

    // No CUDA driver for events: CUPTI's spans only, readiness not measured.
    let run = Run::new("ready-kinds");
    let mut c = run.host(&["window"]);
    c.env("HOST_CUPTI", cupti()).env("ZCTA_GPU", "deep");
    assert!(c.output().unwrap().status.success());
    assert_eq!(process(&run).str("cupti"), Some("on"));
    let ops = run.rows("ops");
    assert_eq!(ops.len(), 3);
    assert!(
        ops.iter()
            .all(|o| o.i64("gpu_start_ns").is_some() && o.i64("gpu_ready_ns").is_none())
    );
    let report = text(&zcta_on("report", &run).stdout);
    assert!(
        report.contains("Queue and sync not split") && report.contains("ZCTA_BUDGET=all"),
        "{report}"
    );

    let run = Run::new("ready-gone");
    let mut c = run.host(&["window"]);
    c.env("HOST_CUPTI", cupti())
        .env("ZCTA_GPU", "deep")
        .env("ZCTA_GPU_READY", "1");
    let out = c.output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(
        text(&out.stderr).contains("ZCTA_GPU_READY is not used any more"),
        "{out:?}"
    );
    assert!(run.rows("ops").iter().all(|o| o.i64("gpu_ready_ns").is_none()));
}

/// The developers' knobs that measure what each part of capture costs:
/// `ZCTA_CUPTI_KINDS` and `ZCTA_CUPTI_CALLBACKS=0` change what is enabled, and the
/// process row says so.
#[test]
fn developer_knobs_change_capture_and_say_so() {
    // kernel records only: the op still joins its kernel; the program's kernels are foreign.
    let run = Run::new("knobs");
    let mut c = run.host(&["window"]);
    c.env("HOST_CUPTI", cupti())
        .env("ZCTA_GPU", "deep")
        .env("ZCTA_CUPTI_KINDS", "kernel");
    let out = c.output().unwrap();
    assert!(out.status.success() && out.stderr.is_empty(), "{out:?}");
    let ops = run.rows("ops");
    assert_eq!(ops.len(), 3);
    assert!(ops.iter().all(|o| o.str("engine") == Some("sm_kernel")));
    let p = process(&run);
    assert_eq!(
        p.u64("gpu_foreign"),
        Some(2),
        "the program's 2 kernels are dropped"
    );
    assert!(
        p.req_str("cupti")
            .starts_with("on (developer settings: kinds kernel,"),
        "{:?}",
        p.str("cupti")
    );
    // No launch callbacks: no activity can be tied to an op.
    let run = Run::new("knobs2");
    let mut c = run.host(&["window"]);
    c.env("HOST_CUPTI", cupti())
        .env("ZCTA_GPU", "deep")
        .env("ZCTA_CUPTI_CALLBACKS", "0");
    assert!(c.output().unwrap().status.success());
    assert!(run.rows("ops").iter().all(|o| o.str("engine") == Some("none")));
    assert!(process(&run).req_str("cupti").contains("launch callbacks off"));
}

/// `zcta_set_recording(0)` pauses recording; calls are still forwarded;
/// `zcta_set_recording(1)` resumes. While paused CUPTI's kinds are off and its launch
/// callbacks stay on, unless `ZCTA_PAUSE_CUPTI=1` switches those off too.
#[test]
fn recording_can_be_paused_and_resumed() {
    for pause_cupti in [false, true] {
        let run = Run::new("pause");
        let mut c = run.host(&["pause"]);
        // A GPU running behind: each kernel takes 5 ms, so the last one launched
        // before the pause starts on the GPU after the resume (its launch, not its
        // start, must decide that it says nothing of the paused work).
        c.env("HOST_CUPTI", cupti())
            .env("ZCTA_GPU", "deep")
            .env("FAKE_CUPTI_KERNEL_NS", "5000000");
        if pause_cupti {
            c.env("ZCTA_PAUSE_CUPTI", "1");
        }
        let out = c.output().unwrap();
        assert!(out.status.success() && out.stderr.is_empty(), "{out:?}");
        let stdout = text(&out.stdout);
        assert!(stdout.contains("ok prev=1,0"), "{stdout}");
        let pair = |key: &str| -> (i64, i64) {
            let v = stdout
                .split_whitespace()
                .find_map(|w| w.strip_prefix(&format!("{key}=")))
                .unwrap_or_else(|| panic!("no {key}= in {stdout}"));
            let (a, b) = v.split_once(',').unwrap();
            (a.parse().unwrap(), b.parse().unwrap())
        };
        let (paused, resumed) = pair("cb");
        if pause_cupti {
            assert_eq!(paused, 0, "callbacks delivered while paused: {stdout}");
        } else {
            assert!(paused >= 3, "the launch callbacks stay on while paused: {stdout}");
        }
        assert!(resumed >= 3, "callbacks after resuming: {stdout}");
        // NCCL's event mask is 0 while paused, so NCCL makes no profiler calls at all.
        let (mask_paused, mask_resumed) = pair("mask");
        assert_eq!(mask_paused, 0, "{stdout}");
        assert_eq!(mask_resumed, 2 | 4 | 8 | 16 | 32 | 512 | 1024 | 2048, "{stdout}");
        let ops = run.rows("ops");
        assert_eq!(ops.len(), 6, "the 3 paused calls are not recorded");
        // ... but they take their sequence numbers: seq stays the op's index on the
        // communicator (so ranks that paused at different ops still agree).
        let mut seqs: Vec<(u64, u64)> = ops
            .iter()
            .map(|o| (o.req_u64("seq"), o.req_u64("call_seq")))
            .collect();
        seqs.sort_unstable();
        assert_eq!(seqs, [(0, 0), (1, 1), (2, 2), (6, 6), (7, 7), (8, 8)]);
        assert!(ops.iter().all(|o| o.str("engine") == Some("sm_kernel")));
        assert_eq!(run.rows("gpu").len(), 6, "no GPU rows for paused calls");
        // The kinds are off while paused: no records of the paused launches at all.
        assert_eq!(process(&run).req_u64("gpu_foreign"), 0);
        // Without events (no CUDA driver here) no op says when its stream was free:
        // CUPTI's records do not.
        assert!(ops.iter().all(|o| o.i64("gpu_ready_ns").is_none()), "{ops:?}");
    }
    // Plain (no shim): the scenario runs without the export.
    let plain = support::host_plain(&["pause"]).output().unwrap();
    assert!(text(&plain.stdout).contains("ok prev=-2,-2"));
}

/// A pause asked for before the first communicator (before capture starts) holds
/// once capture starts: no rows (and with `ZCTA_PAUSE_CUPTI=1` no launch callbacks)
/// until recording resumes.
#[test]
fn a_pause_before_capture_starts_is_applied_when_it_starts() {
    let run = Run::new("pause_early");
    let mut c = run.host(&["pause_early"]);
    c.env("HOST_CUPTI", cupti())
        .env("ZCTA_GPU", "deep")
        .env("ZCTA_PAUSE_CUPTI", "1");
    let out = c.output().unwrap();
    assert!(out.status.success() && out.stderr.is_empty(), "{out:?}");
    let stdout = text(&out.stdout);
    assert!(stdout.contains("ok cb=0,"), "callbacks while paused: {stdout}");
    let field = |key: &str| -> i64 {
        let v = stdout.split_whitespace().find_map(|w| w.strip_prefix(key));
        v.unwrap_or_else(|| panic!("no {key} in {stdout}"))
            .parse()
            .unwrap()
    };
    let resumed = stdout.split_whitespace().find_map(|w| w.strip_prefix("cb=0,"));
    assert!(resumed.unwrap().parse::<i64>().unwrap() >= 3, "{stdout}");
    // The communicator was created while paused: NCCL's profiler plugin took it, so
    // NCCL's events come on with the resume.
    assert_eq!(
        field("mask="),
        2 | 4 | 8 | 16 | 32 | 512 | 1024 | 2048,
        "{stdout}"
    );
    let ops = run.rows("ops");
    assert_eq!(ops.len(), 3, "only the calls after resuming are recorded");
    assert!(ops.iter().all(|o| o.str("engine") == Some("sm_kernel")));
    // ... and recorded: the ops name it, and take their places after the paused ones.
    let comms = run.rows("comms");
    assert_eq!(comms.len(), 1);
    let comm_id = comms[0].req_u64("comm_id");
    assert!(ops.iter().all(|o| o.u64("comm_id") == Some(comm_id)), "{ops:?}");
    let mut seqs: Vec<u64> = ops.iter().map(|o| o.req_u64("seq")).collect();
    seqs.sort_unstable();
    assert_eq!(seqs, [3, 4, 5]);
    let nccl_comms = run.rows("nccl_comms");
    assert_eq!(nccl_comms.len(), 1);
    assert_eq!(nccl_comms[0].u64("comm_id"), Some(comm_id));
}

/// Recording paused or resumed inside a group: the group's ops have rows when its
/// ncclGroupEnd (which launches them) is called while recording, and only those called
/// while recording; every op takes its sequence number; an op after the group is not
/// taken for one of it.
#[test]
fn a_pause_inside_a_group_keeps_groups_and_sequence_numbers_straight() {
    let run = Run::new("pause_group");
    let out = run.host(&["pause_group"]).output().unwrap();
    assert!(out.status.success() && out.stderr.is_empty(), "{out:?}");
    let mut ops = run.rows("ops");
    ops.sort_by_key(|o| o.req_u64("seq"));
    let got: Vec<(u64, Option<u64>)> = ops
        .iter()
        .map(|o| (o.req_u64("seq"), o.u64("group_id")))
        .collect();
    let calls = run.rows("calls");
    let end = calls
        .iter()
        .find(|c| c.str("call") == Some("GroupEnd"))
        .expect("the second group's end");
    let g2 = end.req_u64("group_id");
    // Group 1 (seq 0, 1) ended while paused: no rows. Group 2: seq 3 was called while
    // paused, seq 4 after the resume.
    assert_eq!(got, [(2, None), (4, Some(g2)), (5, None)], "{ops:?}");
    // n_ops: the ops recorded in the group (the one called after the resume).
    assert_eq!(end.u64("n_ops"), Some(1));
    let names: Vec<_> = calls.iter().filter_map(|c| c.str("call")).collect();
    assert_eq!(names, ["CommInitRank", "GroupStart", "GroupEnd", "CommDestroy"]);
}

/// `zcta run -- CMD`: CMD runs under the shim with a run id, its report follows, and
/// its exit status is zcta's.
#[test]
fn zcta_run_records_a_command_and_reports_it() {
    let out = tempfile::tempdir().unwrap();
    let idf = out.path().join("id");
    common::write_unique_id(&idf);
    let shim = common::shim_path();
    let zcta = |args: &[&std::ffi::OsStr]| {
        let mut c = support::clean_cmd(env!("CARGO_BIN_EXE_zcta"));
        c.args(args);
        c.output().unwrap()
    };
    let host = common::fixtures().host.clone();
    let o = zcta(&[
        "run".as_ref(),
        "--out".as_ref(),
        out.path().as_os_str(),
        "--run-id".as_ref(),
        "r1".as_ref(),
        "--shim".as_ref(),
        shim.as_os_str(),
        "--".as_ref(),
        host.as_os_str(),
        "ops".as_ref(),
        "0".as_ref(),
        "1".as_ref(),
        idf.as_os_str(),
        "2".as_ref(),
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let stdout = text(&o.stdout);
    assert!(stdout.contains("ok"), "the command's own output: {stdout}");
    assert!(
        stdout.contains("AllReduce") && stdout.contains("path mix"),
        "{stdout}"
    );
    assert!(out.path().join("r1").join("ops").is_dir());
    // The command's failure is zcta's exit status; no NCCL call, no run directory.
    let o = zcta(&[
        "run".as_ref(),
        "--out".as_ref(),
        out.path().as_os_str(),
        "--shim".as_ref(),
        shim.as_os_str(),
        "--".as_ref(),
        "false".as_ref(),
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o.stderr).contains("no NCCL call was recorded"),
        "{}",
        text(&o.stderr)
    );
    let o = zcta(&[
        "run".as_ref(),
        "--shim".as_ref(),
        "/nonexistent.so".as_ref(),
        "--".as_ref(),
        "true".as_ref(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o.stderr).contains("/nonexistent.so: no such file"),
        "{}",
        text(&o.stderr)
    );
    // A file that is no shared library, and a directory: refused, each saying what it is,
    // the command not run.
    let t = tempfile::tempdir().unwrap();
    let text_file = t.path().join("libzcta_prof.so");
    std::fs::write(&text_file, b"root:x:0:0:root:/root:/bin/bash\n").unwrap();
    let ran = t.path().join("ran");
    for (shim, says) in [
        (text_file.as_path(), "not a shared library (no ELF header)"),
        (t.path(), "not a file but a directory"),
    ] {
        let o = zcta(&[
            "run".as_ref(),
            "--shim".as_ref(),
            shim.as_os_str(),
            "--".as_ref(),
            "touch".as_ref(),
            ran.as_os_str(),
        ]);
        assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
        assert!(text(&o.stderr).contains(says), "{}", text(&o.stderr));
        assert!(!ran.exists());
    }
}

#[test]
fn sampling_windows_measure_only_the_ops_called_in_them() {
    // 50 ms of every 400 ms, aligned to the clock; ~1.2 s of calls, 11 per 20 ms.
    let run = Run::new("gpu-sample");
    let out = ops_run(
        &run,
        60,
        &[
            ("HOST_CUPTI", &cupti()),
            ("ZCTA_GPU", "deep"),
            ("HOST_ITER_GAP_MS", "20"),
            ("ZCTA_SAMPLE", "50ms/400ms"),
        ],
    );
    assert!(out.stderr.is_empty(), "{}", text(&out.stderr));
    let p = process(&run);
    assert_eq!(p.str("cupti"), Some("on"));
    assert_eq!(
        p.str("gpu_sampling"),
        Some("50 ms of every 400 ms (windows aligned to CLOCK_REALTIME)")
    );
    // A marked op never loses its GPU side to a window closing.
    assert_eq!(p.u64("ops_without_gpu"), Some(0));
    let ops = run.rows("ops");
    assert_eq!(ops.len(), 60 * 11);
    let (measured, unmeasured): (Vec<&Row>, Vec<&Row>) = ops.iter().partition(|o| !o.is_null("engine"));
    assert_eq!(p.u64("ops_unsampled"), Some(unmeasured.len() as u64));
    assert!(
        !measured.is_empty() && !unmeasured.is_empty(),
        "{} measured",
        measured.len()
    );
    const MS: i64 = 1_000_000;
    for o in &measured {
        assert_eq!(o.str("engine"), Some("sm_kernel"));
        assert!(o.i64("gpu_start_ns").is_some() && o.i64("launch_ns").is_some());
        // An ungrouped op is sampled by its own call's start, which must lie in a
        // window (a grouped one by its ncclGroupEnd, which is not in the table).
        let phase = o.req_i64("api_start_ns").rem_euclid(400 * MS);
        if o.is_null("group_id") {
            assert!(
                phase < 50 * MS,
                "measured op called {} ms into the period",
                phase / MS
            );
        }
    }
    // CUPTI's kinds are on from 50 ms before a window until its launches' records
    // arrived: the unsampled ops' kernels recorded then are dropped, never joined to a
    // sampled op; outside that, they are not recorded at all.
    let foreign = p.req_u64("gpu_foreign");
    assert!(
        foreign > 0 && foreign < unmeasured.len() as u64,
        "{foreign} of {}",
        unmeasured.len()
    );
    assert!(run.rows("gpu").iter().all(|g| {
        let (op, group) = (g.u64("op_id"), g.u64("group_id"));
        measured
            .iter()
            .any(|o| o.u64("op_id") == op && op.is_some() || group.is_some() && o.u64("group_id") == group)
    }));
    for o in &unmeasured {
        for c in ["gpu_start_ns", "gpu_end_ns", "launch_ns", "kernel", "n_kernels"] {
            assert!(o.is_null(c), "{c} of an unsampled op");
        }
    }
    // No ungrouped op called outside a window is measured.
    for o in ops.iter().filter(|o| o.is_null("group_id")) {
        let phase = o.req_i64("api_start_ns").rem_euclid(400 * MS);
        if phase >= 50 * MS {
            assert!(
                o.is_null("engine"),
                "op called {} ms into the period measured",
                phase / MS
            );
        }
    }
    // The report says the GPU side was sampled, and how many ops it lacks.
    let rep = zcta_on("report", &run);
    let t = text(&rep.stdout);
    assert!(rep.status.success(), "{}", text(&rep.stderr));
    assert!(t.contains("sampled (ZCTA_SAMPLE)"), "{t}");
    assert!(
        t.contains(&format!(
            "{} ops not captured (called outside the windows",
            unmeasured.len()
        )),
        "{t}"
    );
    // NCCL's events follow the windows too (the stand-in NCCL reports P2p events of
    // the Send/Recv group here): every measured Send/Recv has them, not every one.
    let nccl = run.rows("nccl_ops");
    let with_events: std::collections::BTreeSet<u64> = nccl.iter().filter_map(|e| e.u64("op_id")).collect();
    let p2p: Vec<&Row> = ops
        .iter()
        .filter(|o| matches!(o.req_str("op"), "Send" | "Recv"))
        .collect();
    assert!(p2p.iter().any(|o| !with_events.contains(&o.req_u64("op_id"))));
    for o in p2p.iter().filter(|o| !o.is_null("engine")) {
        let id = o.req_u64("op_id");
        assert!(
            with_events.contains(&id),
            "measured op {id} without NCCL's events"
        );
    }
}

#[test]
fn ops_captured_into_a_cuda_graph_are_not_measured() {
    // The stand-in NCCL reports every call as graph-captured in its CollApi/P2pApi
    // events, as NCCL does for calls on a capturing stream. On this one-rank
    // communicator only Send and Recv have those events (collectives take NCCL's
    // one-rank shortcut, which emits none): nothing says whether the others were.
    let run = Run::new("gpu-graph");
    let out = ops_run(
        &run,
        2,
        &[
            ("HOST_CUPTI", &cupti()),
            ("ZCTA_GPU", "deep"),
            ("FAKE_NCCL_GRAPH_CAPTURED", "1"),
        ],
    );
    assert!(out.stderr.is_empty(), "{}", text(&out.stderr));
    let p = process(&run);
    let ops = run.rows("ops");
    assert_eq!(ops.len(), 2 * 11);
    let mut captured = 0;
    for o in &ops {
        let p2p = matches!(o.req_str("op"), "Send" | "Recv");
        let want = if p2p {
            support::Val::Bool(true)
        } else {
            support::Val::Null
        };
        assert_eq!(o.get("graph_captured"), &want, "{o:?}");
        if p2p {
            captured += 1;
            for col in [
                "engine",
                "gpu_start_ns",
                "gpu_end_ns",
                "gpu_ready_ns",
                "n_kernels",
            ] {
                assert!(o.is_null(col), "{col} of a captured op: {o:?}");
            }
        } else {
            assert_eq!(o.str("engine"), Some("sm_kernel"), "{o:?}");
        }
    }
    assert_eq!(captured, 4);
    assert_eq!(p.u64("ops_graph_captured"), Some(4));
    assert_eq!(p.u64("ops_without_gpu"), Some(0));
    let report = text(&zcta_on("report", &run).stdout);
    assert!(report.contains("Ops captured into CUDA graphs"), "{report}");

    // Eager calls say so; without zcta's plugin nothing says either way.
    for (env, want) in [
        (
            vec![("HOST_CUPTI", cupti()), ("ZCTA_GPU", "deep".into())],
            support::Val::Bool(false),
        ),
        (
            vec![
                ("HOST_CUPTI", cupti()),
                ("ZCTA_GPU", "deep".into()),
                ("ZCTA_NCCL_PLUGIN", "0".into()),
            ],
            support::Val::Null,
        ),
    ] {
        let run = Run::new("gpu-eager");
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        ops_run(&run, 1, &env);
        let ops = run.rows("ops");
        let p2p: Vec<&Row> = ops
            .iter()
            .filter(|o| matches!(o.req_str("op"), "Send" | "Recv"))
            .collect();
        assert_eq!(p2p.len(), 2);
        for o in p2p {
            assert_eq!(o.get("graph_captured"), &want, "{env:?}");
        }
        assert!(
            ops.iter().all(|o| o.str("engine") == Some("sm_kernel")),
            "{env:?}"
        );
        assert_eq!(process(&run).u64("ops_graph_captured"), Some(0));
    }
}
