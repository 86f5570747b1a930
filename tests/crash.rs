//! SIGKILL durability: a killed process loses at most the last flush interval
//! (`ZCTA_FLUSH_MS`, 500 ms by default); `zcta recover` turns its write-ahead logs into
//! Parquet, marks its process row `killed`, and is idempotent.
//!
//! Needs the shim: `cargo build -p zcta-shim` before `cargo test`.

mod common;
mod support;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Output, Stdio};
use std::time::{Duration, Instant};

use support::{Row, Run, text};

const SEC: i64 = 1_000_000_000;

fn zcta(args: &[&Path]) -> Output {
    let mut c = support::clean_cmd(env!("CARGO_BIN_EXE_zcta"));
    c.args(args);
    c.output().expect("running zcta")
}

fn recover(run_dir: &Path) -> Output {
    let mut c = support::clean_cmd(env!("CARGO_BIN_EXE_zcta"));
    c.arg("recover").arg(run_dir);
    c.output().expect("running zcta recover")
}

/// A running `host loop`; SIGKILLed when dropped, so that a failing assertion never
/// leaves it running.
struct Looping(Child);

impl Looping {
    fn pid(&self) -> i32 {
        self.0.id() as i32
    }
}

impl Drop for Looping {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `host loop IDFILE` under the shim (plus `env`) and waits for "started".
fn start_loop_with(run: &Run, env: &[(&str, &str)]) -> (Looping, std::path::PathBuf) {
    let idf = run.scratch("uid");
    common::write_unique_id(&idf);
    let mut cmd = run.host(&["loop", idf.to_str().unwrap()]);
    cmd.envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut child = Looping(cmd.spawn().expect("spawn host loop"));
    let mut line = String::new();
    BufReader::new(child.0.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "started\n");
    (child, idf)
}

fn start_loop(run: &Run) -> (Looping, std::path::PathBuf) {
    start_loop_with(run, &[])
}

/// SIGKILLs the child (and reaps it so that its pid is gone); returns the time of
/// the kill.
fn kill(mut child: Looping) -> i64 {
    let t = zcta::clock::now_ns();
    child.0.kill().expect("SIGKILL");
    let st = child.0.wait().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(st.signal(), Some(9));
    t
}

/// The first file of `dir` named `*.EXT`.
fn file_ending(dir: &Path, ext: &str) -> std::path::PathBuf {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == ext))
        .unwrap_or_else(|| panic!("no *.{ext} in {}", dir.display()))
}

fn leftovers(dir: &Path) -> Vec<String> {
    support::list_files(dir)
        .into_iter()
        .filter(|f| f.rsplit('/').next().unwrap().starts_with('_'))
        .collect()
}

#[test]
fn sigkill_then_recover() {
    let run = Run::new("killed");
    let (child, idf) = start_loop(&run);
    let pid = child.pid();
    std::thread::sleep(Duration::from_millis(1500));

    // While the process runs, recover leaves its logs alone.
    let live = recover(&run.dir());
    assert_eq!(live.status.code(), Some(0), "{live:?}");
    assert!(
        text(&live.stdout).contains("still runs"),
        "{}",
        text(&live.stdout)
    );
    assert!(!leftovers(&run.dir()).is_empty());

    std::thread::sleep(Duration::from_millis(1500));
    let t_kill = kill(child);

    // Before recovery: reading works, reports the pending logs, reads no row. (The
    // plugin tables stay empty: a 1-rank communicator emits no plugin events.)
    for table in ["ops", "comms", "calls", "process"] {
        let d = zcta::reader::read_table(&run.dir(), table).expect("read before recovery");
        assert!(!d.pending_logs.is_empty(), "{table}: no pending log");
        assert!(
            d.skipped.is_empty(),
            "{table}: leftovers were read as Parquet: {:?}",
            d.skipped
        );
        assert_eq!(d.num_rows(), 0, "{table}");
        assert!(d.files.is_empty(), "{table}: {:?}", d.files);
    }
    let s = zcta(&[Path::new("summary"), &run.dir()]);
    assert_eq!(s.status.code(), Some(0), "{s:?}");
    assert!(text(&s.stdout).contains("zcta recover"), "{}", text(&s.stdout));

    let r = recover(&run.dir());
    assert_eq!(r.status.code(), Some(0), "{r:?}");
    assert!(r.stderr.is_empty(), "{}", text(&r.stderr));
    assert!(text(&r.stdout).contains("recovered"), "{}", text(&r.stdout));
    assert_eq!(
        leftovers(&run.dir()),
        Vec::<String>::new(),
        "logs and tmp files removed"
    );

    let ops = run.rows("ops");
    assert!(ops.len() >= 100, "only {} rows recovered", ops.len());
    let cid = support::comm_id_of(&support::read_id(&idf));
    for o in &ops {
        assert_eq!(o.str("op"), Some("AllReduce"));
        assert_eq!(o.u64("comm_id"), Some(cid));
        assert_eq!(o.i32("pid"), Some(pid));
        assert_eq!(o.i32("result"), Some(0));
    }
    // What was recovered is a prefix of the calls made (no gap)...
    let mut sorted: Vec<&Row> = ops.iter().collect();
    sorted.sort_by_key(|o| o.req_u64("call_seq"));
    for (i, o) in sorted.iter().enumerate() {
        assert_eq!(o.req_u64("call_seq"), i as u64, "gap in the recovered calls");
        assert_eq!(o.u64("seq"), Some(i as u64));
    }
    // ...that includes every call made more than 2 s before the kill.
    let deadline = t_kill - 2 * SEC;
    let old: Vec<u64> = sorted
        .iter()
        .filter(|o| o.req_i64("api_start_ns") <= deadline)
        .map(|o| o.req_u64("call_seq"))
        .collect();
    assert_eq!(old, (0..old.len() as u64).collect::<Vec<_>>());
    let newest = sorted.iter().map(|o| o.req_i64("api_start_ns")).max().unwrap();
    assert!(
        newest >= deadline,
        "newest recovered call {:.3} s before the kill",
        (t_kill - newest) as f64 / 1e9
    );

    let p = run.rows("process");
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].str("end_reason"), Some("killed"));
    assert_eq!(p[0].i32("pid"), Some(pid));
    assert!(p[0].is_null("end_ns"), "{:?}", p[0]);
    let comms = run.rows("comms");
    assert_eq!(comms.len(), 1);
    assert_eq!(comms[0].u64("comm_id"), Some(cid));
    let calls = run.rows("calls");
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].str("call"), Some("CommInitRank"));

    // Idempotent.
    let again = recover(&run.dir());
    assert_eq!(again.status.code(), Some(0));
    assert!(
        text(&again.stdout).contains("nothing to recover"),
        "{}",
        text(&again.stdout)
    );
    assert_eq!(run.rows("ops").len(), ops.len());
    let s = zcta(&[Path::new("summary"), &run.dir()]);
    assert_eq!(s.status.code(), Some(0), "{s:?}");
}

#[test]
fn recover_keeps_complete_batches_of_a_torn_log() {
    let run = Run::new("torn");
    let (child, _) = start_loop(&run);
    std::thread::sleep(Duration::from_millis(1800));
    kill(child);

    let ops_dir = run.dir().join("ops");
    let wal = file_ending(&ops_dir, "wal");
    // Tear the last batch.
    let len = std::fs::metadata(&wal).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&wal).unwrap();
    f.set_len(len - 50).unwrap();
    drop(f);

    let r = recover(&run.dir());
    assert_eq!(r.status.code(), Some(0), "{r:?}");
    assert!(
        text(&r.stdout).contains("incomplete last batch dropped"),
        "{}",
        text(&r.stdout)
    );
    let ops = run.rows("ops");
    assert!(!ops.is_empty());
    let mut cs: Vec<u64> = ops.iter().map(|o| o.req_u64("call_seq")).collect();
    cs.sort_unstable();
    assert_eq!(cs, (0..cs.len() as u64).collect::<Vec<_>>());
    assert_eq!(run.rows("process")[0].str("end_reason"), Some("killed"));
}

/// A leftover log next to the closed Parquet file of the same segment (the process
/// died between the rename and the delete) is removed, not turned into duplicates.
#[test]
fn recover_removes_stale_logs() {
    let run = Run::new("stale");
    run.run_ok(&["simulate"]);
    let ops_file = std::fs::read_dir(run.dir().join("ops"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .next()
        .unwrap();
    let wal = zcta::sink::wal_path_for(&ops_file);
    // The log as the writer left it: the segment's rows.
    let schema = <zcta::tables::OpsTable as zcta::tables::Table>::schema();
    let rows = zcta::reader::read_file(&ops_file, &schema).unwrap();
    let mut w =
        arrow_ipc::writer::StreamWriter::try_new(std::fs::File::create(&wal).unwrap(), &schema).unwrap();
    for b in &rows {
        w.write(b).unwrap();
    }
    w.finish().unwrap();
    let d = zcta::reader::read_table(&run.dir(), "ops").unwrap();
    assert_eq!(d.num_rows(), 1);
    assert_eq!(d.pending_logs, vec![wal.clone()]);
    let r = recover(&run.dir());
    assert_eq!(r.status.code(), Some(0), "{r:?}");
    assert!(
        text(&r.stdout).contains("removed stale log"),
        "{}",
        text(&r.stdout)
    );
    assert!(!wal.exists());
    assert_eq!(run.rows("ops").len(), 1);
}

/// `process.ops_rows` is documented as "ops rows written". For a killed process the
/// row restored by `zcta recover` is the one logged at activation, so it reports 0
/// next to the thousands of ops rows recovered for the same pid.
#[test]
fn recovered_process_row_counts_the_recovered_rows() {
    let run = Run::new("counts");
    let (child, _) = start_loop(&run);
    let pid = child.pid();
    std::thread::sleep(Duration::from_millis(1200));
    kill(child);
    let r = recover(&run.dir());
    assert_eq!(r.status.code(), Some(0), "{r:?}");
    let ops = run.rows("ops");
    assert!(!ops.is_empty());
    let p = run.rows("process");
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].i32("pid"), Some(pid));
    assert_eq!(p[0].str("end_reason"), Some("killed"));
    assert_eq!(
        (
            p[0].u64("ops_rows"),
            p[0].u64("calls_rows"),
            p[0].u64("comms_rows")
        ),
        (Some(ops.len() as u64), Some(1), Some(1)),
        "process row of the killed pid vs the rows recovered for it"
    );
}

/// Many small segments (ZCTA_SEGMENT_ROWS=50, ZCTA_FLUSH_MS=10): the closed ones are
/// readable while the process still runs and after it is killed; recovery adds the
/// open one, and together they hold every call with no gap and no duplicate.
#[test]
fn kill_with_rolled_segments() {
    let run = Run::new("segments");
    let (child, _) = start_loop_with(&run, &[("ZCTA_SEGMENT_ROWS", "50"), ("ZCTA_FLUSH_MS", "10")]);
    std::thread::sleep(Duration::from_millis(1200));
    let live = zcta::reader::read_table(&run.dir(), "ops").unwrap();
    assert!(live.skipped.is_empty(), "{:?}", live.skipped);
    assert!(
        live.files.len() >= 2,
        "segments closed while running: {:?}",
        live.files
    );
    assert!(live.num_rows() >= 100);
    kill(child);

    let before = zcta::reader::read_table(&run.dir(), "ops").unwrap();
    // One open segment, or none when the kill fell between a roll and the next cut.
    assert!(before.pending_logs.len() <= 1, "{:?}", before.pending_logs);
    assert!(before.skipped.is_empty(), "{:?}", before.skipped);
    let r = recover(&run.dir());
    assert_eq!(r.status.code(), Some(0), "{r:?}");
    assert_eq!(leftovers(&run.dir()), Vec::<String>::new());

    let files: Vec<String> = support::list_files(&run.dir().join("ops"));
    let host = support::host_name();
    let pid = run.rows("process")[0].req_i32("pid");
    let process_files = support::list_files(&run.dir().join("process"));
    assert_eq!(process_files.len(), 1, "{process_files:?}");
    let prefix = process_files[0].strip_suffix(".parquet").unwrap();
    assert!(prefix.starts_with(&format!("{host}-p{pid}-u")), "{prefix}");
    let want: Vec<String> = (0..files.len())
        .map(|i| format!("{prefix}-{i:05}.parquet"))
        .collect();
    assert_eq!(files, want, "consecutive segments");

    let ops = run.rows("ops");
    assert!(ops.len() >= before.num_rows());
    call_seqs_from_zero(&ops, "no gap, no duplicate");
}

/// How old the newest recovered ops row is when a looping host (one AllReduce per
/// millisecond) is SIGKILLed after `run_for`: the crash window. Returns the age in ns
/// (kill time minus the newest row's `api_end_ns`) and the rows recovered.
fn crash_window(name: &str, env: &[(&str, &str)], run_for: Duration) -> (i64, usize) {
    let run = Run::new(name);
    let (child, _) = start_loop_with(&run, env);
    std::thread::sleep(run_for);
    let t_kill = kill(child);
    let r = recover(&run.dir());
    assert_eq!(r.status.code(), Some(0), "{r:?}");
    let ops = run.rows("ops");
    let newest = ops
        .iter()
        .map(|o| o.req_i64("api_end_ns"))
        .max()
        .expect("ops rows recovered");
    (t_kill - newest, ops.len())
}

fn libcuda() -> String {
    common::fixtures().libcuda.display().to_string()
}

fn libcupti() -> String {
    common::fixtures().libcupti.display().to_string()
}

/// The newest ops row recovered after a SIGKILL of the slowest of three runs; each
/// age is printed.
fn worst_window(name: &str, env: &[(&str, &str)]) -> i64 {
    (0..3)
        .map(|i| {
            let (age, n) = crash_window(&format!("{name}{i}"), env, Duration::from_millis(2500));
            eprintln!(
                "{name}: newest recovered ops row {:.3} s old ({n} rows)",
                age as f64 / 1e9
            );
            age
        })
        .max()
        .unwrap()
}

/// `ZCTA_FLUSH_MS` and `ZCTA_GPU_HOLD_MS` at their defaults.
const FLUSH: i64 = SEC / 2;
const HOLD: i64 = SEC;
/// The writer's round (20 ms), the stand-in GPU's work, and a loaded machine.
const SLACK: i64 = 3 * SEC / 10;

/// Default GPU mode (every op timed with GPU stamps: `ZCTA_BUDGET=all`, the stand-in
/// driver): an op row waits for its stamps and the clock anchor after them (taken at
/// the latest a quarter of the hold after its call), so after a SIGKILL nothing older
/// than that, the flush interval and the writer's round is lost (measured: 0.63-0.67 s).
#[test]
fn crash_window_with_gpu_stamps() {
    let age = worst_window(
        "window-events",
        &[("HOST_CUDA", &libcuda()), ("ZCTA_BUDGET", "all")],
    );
    assert!(
        age <= HOLD / 4 + FLUSH + SLACK,
        "newest recovered ops row {:.3} s before the kill",
        age as f64 / 1e9
    );
}

/// Deep mode (CUPTI, the stand-in libcupti): an op row waits the GPU hold for CUPTI's
/// records, then up to the flush interval (measured: 1.47-1.49 s).
#[test]
fn crash_window_in_deep_mode() {
    let age = worst_window(
        "window-deep",
        &[
            ("HOST_CUDA", &libcuda()),
            ("HOST_CUPTI", &libcupti()),
            ("ZCTA_GPU", "deep"),
            ("ZCTA_BUDGET", "all"),
        ],
    );
    assert!(
        age <= HOLD + FLUSH + SLACK,
        "newest recovered ops row {:.3} s before the kill",
        age as f64 / 1e9
    );
}

/// Ops rows per iteration of `host ops` on one rank.
const OPS_PER_ITER: u64 = 11;

/// `host ops` on one rank for `iters` iterations, on the stand-in disk of `bytes`
/// (`FAKE_DISK_BYTES`, preloaded next to the shim) whose file system says it has
/// 4 GiB more free than it has: a disk that fills up faster than zcta looks, so the
/// logs keep their claims ([`zcta::sink::CLAIM_FLOOR`]); the host behaves as without
/// the shim.
fn on_a_small_disk(name: &str, iters: u64, bytes: u64) -> (Run, std::process::Output) {
    let (run, out) = on_disk(name, iters, bytes, 4 << 30, |_| Vec::new());
    assert!(out.status.success(), "{out:?}");
    assert_eq!(text(&out.stdout), "ok\n");
    (run, out)
}

/// `host ops` as [`on_a_small_disk`], its file system saying it has `spare` bytes
/// more free than it has, with what `env` gives for the run set too.
fn on_disk(
    name: &str,
    iters: u64,
    bytes: u64,
    spare: u64,
    env: impl FnOnce(&Run) -> Vec<(&'static str, String)>,
) -> (Run, std::process::Output) {
    let run = Run::new(name);
    let idf = run.scratch("uid");
    common::write_unique_id(&idf);
    let mut cmd = run.host(&["ops", "0", "1", idf.to_str().unwrap(), &iters.to_string()]);
    let preload = format!(
        "{} {}",
        common::shim_path().display(),
        common::fixtures().libdisk.display()
    );
    cmd.env("LD_PRELOAD", preload)
        .env("FAKE_DISK_BYTES", bytes.to_string())
        .env("FAKE_DISK_SPARE", spare.to_string());
    for (k, v) in env(&run) {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    (run, out)
}

/// The program's own 10 MiB file written after its NCCL calls, on a 16 MiB disk.
const CHECKPOINT: u64 = 10 << 20;
const SMALL_DISK: u64 = 16 << 20;

/// The host's setting to write [`CHECKPOINT`] bytes into the run's scratch directory.
fn checkpoint(run: &Run) -> Vec<(&'static str, String)> {
    let path = run.scratch("checkpoint");
    vec![("HOST_WRITE_AFTER", format!("{}:{CHECKPOINT}", path.display()))]
}

/// A file system with less than [`zcta::sink::CLAIM_FLOOR`] free: zcta claims no disk
/// ahead of its logs, so the program's write that fits without zcta fits with it (its
/// rows take only what they use). The same disk saying it has room beyond the floor
/// lets the ops log claim its 8 MiB, and the write fails: the claim is what took it.
#[test]
fn a_nearly_full_disk_leaves_its_room_to_the_program() {
    const ITERS: u64 = 50;
    let (run, out) = on_disk("near-full", ITERS, SMALL_DISK, 0, checkpoint);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(text(&out.stdout), "ok\n");
    assert!(out.stderr.is_empty(), "{}", text(&out.stderr));
    assert_eq!(run.rows("ops").len() as u64, ITERS * OPS_PER_ITER);

    let (_, out) = on_disk("near-full-claimed", ITERS, SMALL_DISK, 4 << 30, checkpoint);
    assert_eq!(out.status.code(), Some(7), "the claim took the room: {out:?}");
    assert!(
        text(&out.stderr).contains("No space left"),
        "{}",
        text(&out.stderr)
    );
}

/// A disk that fills up as it is written, saying truly how much room it has left: below
/// [`zcta::sink::CLAIM_FLOOR`] the ops log still claims a little
/// ([`zcta::sink::LOW_CLAIM`]) and keeps it, so it keeps its first rows, without a gap,
/// when the other tables have run out; the process log kept room for its final row.
#[test]
fn a_disk_that_fills_as_it_is_written_keeps_the_first_ops() {
    const ITERS: u64 = 1500;
    let (run, out) = on_disk("fills-truly", ITERS, 3_500_000, 0, |_| Vec::new());
    assert!(out.status.success(), "{out:?}");
    assert_eq!(text(&out.stdout), "ok\n");
    let r = recover(&run.dir());
    assert_eq!(r.status.code(), Some(0), "{r:?}");
    let p = run.rows("process");
    assert_eq!(p.len(), 1);
    assert_eq!(
        p[0].str("end_reason"),
        Some("error"),
        "the final row is there: {:?}",
        p[0]
    );
    let why = p[0].req_str("write_errors");
    the_first_ops_kept(&run, ITERS * OPS_PER_ITER, why);
}

/// A file system that runs low while the logs hold their claims (from saying it has
/// room beyond [`zcta::sink::CLAIM_FLOOR`] to saying it has the 16 MiB it has): the
/// writer gives back what they claimed and did not use, and the program's write,
/// made after it, fits.
#[test]
fn claims_are_given_back_when_the_disk_runs_low() {
    const ITERS: u64 = 800;
    let (run, out) = on_disk("given-back", ITERS, SMALL_DISK, 4 << 30, |run| {
        let mut env = checkpoint(run);
        env.push(("HOST_DROP_SPARE_AT", "20".to_string()));
        // 1.5 s or more of calls after the drop: the writer looks every 100 ms.
        env.push(("HOST_ITER_GAP_MS", "2".to_string()));
        env
    });
    assert!(out.status.success(), "{out:?}");
    assert_eq!(text(&out.stdout), "ok\n");
    assert_eq!(run.rows("ops").len() as u64, ITERS * OPS_PER_ITER);
}

/// The run's ops rows, checked to be at least half of the `made` and the first ones,
/// without a gap in `call_seq` (`why`: what the process row said, for the message).
fn the_first_ops_kept(run: &Run, made: u64, why: &str) -> Vec<support::Row> {
    let ops = run.rows("ops");
    assert!(
        ops.len() as u64 >= made / 2,
        "{} of {made} ops rows kept ({why})",
        ops.len()
    );
    call_seqs_from_zero(&ops, "the first ops, no gap");
    ops
}

/// Checks that the ops rows' `call_seq`s are 0, 1, … in some order: each op once, from
/// the first, none missing (`what` says so when not).
fn call_seqs_from_zero(ops: &[support::Row], what: &str) {
    let mut cs: Vec<u64> = ops.iter().map(|o| o.req_u64("call_seq")).collect();
    cs.sort_unstable();
    assert_eq!(cs, (0..cs.len() as u64).collect::<Vec<_>>(), "{what}");
}

/// A disk that fills up during the run (the stand-in disk of `FAKE_DISK_BYTES`,
/// preloaded next to the shim; without a limit this run peaks at 4 MB, 3.9 MB of them
/// the ops log): the host behaves as without the shim; the `ops` log, which claimed
/// its disk first, keeps most of its rows (it is logged in slices: what did not fit
/// is lost, never what came before) while the other tables run out of room; the
/// `process` row counts the rows each table lost, and its final row, with no room
/// for its file, goes into its log. After `zcta recover` everything is readable and
/// the process row says `error`, with the count.
#[test]
fn a_full_disk_keeps_the_ops_rows_first_and_counts_what_is_lost() {
    const ITERS: u64 = 1500;
    let (run, out) = on_a_small_disk("full", ITERS, 3_500_000);
    for line in text(&out.stderr).lines() {
        assert!(line.starts_with("zcta: "), "{}", text(&out.stderr));
    }

    let r = recover(&run.dir());
    assert_eq!(r.status.code(), Some(0), "{r:?}");
    let p = run.rows("process");
    assert_eq!(p.len(), 1);
    let p = &p[0];
    assert_eq!(p.str("end_reason"), Some("error"), "{p:?}");
    let errors = p.req_str("write_errors");
    assert!(errors.contains("No space left on device"), "{errors}");
    // "rows not written: ops N, calls M, ..." names each table that lost rows.
    let lost: BTreeMap<String, u64> = errors
        .split("rows not written: ")
        .nth(1)
        .and_then(|s| s.split(';').next())
        .unwrap_or_else(|| panic!("no per-table count in {errors:?}"))
        .split(", ")
        .map(|part| {
            let (table, n) = part.split_once(' ').unwrap();
            (table.to_string(), n.parse().unwrap())
        })
        .collect();
    assert!(lost.get("calls").is_some_and(|&n| n > 0), "{errors}");
    // The rows not written and those the hot path no longer made once the ops table
    // was full.
    let dropped = p.req_u64("records_dropped");
    assert!(dropped >= lost.values().sum::<u64>(), "{dropped} {errors}");

    let ops = the_first_ops_kept(&run, ITERS * OPS_PER_ITER, errors);
    let made = ITERS * OPS_PER_ITER;
    assert_eq!(p.u64("ops_rows"), Some(ops.len() as u64));
    assert!(ops.len() as u64 + lost.get("ops").copied().unwrap_or(0) <= made);
    let s = zcta(&[Path::new("summary"), &run.dir()]);
    assert!(
        text(&s.stdout).contains(&format!("dropped    {dropped:>10} records")),
        "{}",
        text(&s.stdout)
    );
}

/// The final `process` row that had no room for its file went into its log, which
/// stays for `zcta recover`: the disk that log claimed at the start (a few rows'
/// worth, for that row) is given back once the row is in it, so that it does not keep
/// the full disk full for the recovery (on a disk whose only free room was that claim,
/// the recovery had no room for the Parquet file).
#[test]
fn a_process_log_left_on_a_full_disk_holds_no_claimed_disk() {
    use std::os::unix::fs::MetadataExt;
    let (run, _) = on_a_small_disk("full-claim", 1500, 3_500_000);
    let logs: Vec<_> = std::fs::read_dir(run.dir().join("process"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "wal"))
        .collect();
    assert_eq!(logs.len(), 1, "the final row is in the process log: {logs:?}");
    let m = std::fs::metadata(&logs[0]).unwrap();
    // A file system block or two past its end at most, never the whole claim.
    let held = m.blocks() * 512;
    assert!(
        held <= m.len() + 8192,
        "{}: {} bytes long, holds {held} bytes of disk",
        logs[0].display(),
        m.len()
    );
    let r = recover(&run.dir());
    assert_eq!(r.status.code(), Some(0), "{r:?}");
    assert_eq!(run.rows("process")[0].str("end_reason"), Some("error"));
}

/// A disk of 300 KB: the process log claims room for a few of its rows only, so the
/// ops log still claims its least and keeps the first ops, without a gap; after
/// `zcta recover` the run reads.
#[test]
fn a_disk_of_300_kb_keeps_the_first_ops() {
    let (run, _) = on_a_small_disk("disk-300k", 1500, 300_000);
    let r = recover(&run.dir());
    assert_eq!(r.status.code(), Some(0), "{r:?}");
    let ops = run.rows("ops");
    assert!(ops.len() >= 100, "{} ops rows kept of 1500", ops.len());
    call_seqs_from_zero(&ops, "the first ops, no gap");
}

/// A disk of 1 MB, smaller than the ops log's first claim (8 MiB) and than one batch
/// of its rows in memory: the log is written in slices that fit what it could claim,
/// so it keeps most of the ops, the first ones without a gap (a single write of the
/// batch failed and lost every row).
#[test]
fn a_tiny_disk_still_keeps_the_first_ops() {
    const ITERS: u64 = 300;
    let (run, _) = on_a_small_disk("tiny-disk", ITERS, 1_000_000);
    let r = recover(&run.dir());
    assert!(r.status.code().is_some_and(|c| c <= 1), "{r:?}");
    the_first_ops_kept(&run, ITERS * OPS_PER_ITER, "");
}

/// A readable file at a log's final name proves the log stale only when it is the
/// same table's and holds at least the log's rows: another table's file, or one with
/// fewer rows, leaves the log and its rows in place.
#[test]
fn a_file_at_the_final_name_that_does_not_cover_the_log_keeps_it() {
    let run = Run::new("covered");
    let (child, _idf) = start_loop(&run);
    std::thread::sleep(Duration::from_millis(1500));
    kill(child);
    let ops_dir = run.dir().join("ops");
    let wal = file_ending(&ops_dir, "wal");
    let final_path = zcta::sink::final_path_for_wal(&wal).unwrap();
    let log_len = std::fs::metadata(&wal).unwrap().len();
    // Another table's file (the process log, recovered into Parquet in a copy of the run).
    let proc_wal = file_ending(&run.dir().join("process"), "wal");
    std::fs::copy(recovered_copy(&run, &proc_wal), &final_path).unwrap();
    // recover refuses, saying `says`, and leaves the log as it was.
    let kept_saying = |says: &str| {
        let r = recover(&run.dir());
        assert_eq!(r.status.code(), Some(1), "{}", text(&r.stdout));
        let err = text(&r.stderr) + &text(&r.stdout);
        assert!(err.contains(says), "{err}");
        assert_eq!(
            std::fs::metadata(&wal).unwrap().len(),
            log_len,
            "the log was touched"
        );
    };
    kept_saying("not ops's");
    // The same table's file with fewer rows: an ops file of the log's first row.
    let (batches, _) = zcta::recover::read_log(&wal).unwrap();
    assert!(batches.iter().map(|b| b.num_rows()).sum::<usize>() > 1);
    std::fs::remove_file(&final_path).unwrap();
    // The killed writer's unfinished Parquet file is where this one is made.
    let _ = std::fs::remove_file(zcta::sink::tmp_path_for(&final_path));
    zcta::sink::write_parquet_file::<zcta::tables::OpsTable>(&final_path, &[batches[0].slice(0, 1)]).unwrap();
    kept_saying("holds 1 rows where the log holds");
    // The same table's file with as many rows, but not the log's (its first row moved
    // to its end): the count is no proof, and the log is kept.
    std::fs::remove_file(&final_path).unwrap();
    let mut moved: Vec<_> = vec![batches[0].slice(1, batches[0].num_rows() - 1)];
    moved.extend(batches[1..].iter().cloned());
    moved.push(batches[0].slice(0, 1));
    zcta::sink::write_parquet_file::<zcta::tables::OpsTable>(&final_path, &moved).unwrap();
    kept_saying("its row 0 is not the log's row 0");
    // A FIFO at the final name (which no writer ever opens): never opened, so recover
    // does not block on it, and the log is kept.
    std::fs::remove_file(&final_path).unwrap();
    let rc = mkfifo(&final_path);
    assert!(rc.success(), "mkfifo: {rc:?}");
    let mut c = support::clean_cmd(env!("CARGO_BIN_EXE_zcta"));
    let mut child = c
        .arg("recover")
        .arg(run.dir())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            panic!("zcta recover blocked on a FIFO at {}", final_path.display());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let r = child.wait_with_output().unwrap();
    assert_eq!(r.status.code(), Some(1), "{}", text(&r.stdout));
    let err = text(&r.stderr) + &text(&r.stdout);
    assert!(err.contains("not a regular file"), "{err}");
    assert_eq!(
        std::fs::metadata(&wal).unwrap().len(),
        log_len,
        "the log was touched"
    );
}

/// `mkfifo PATH`.
fn mkfifo(path: &Path) -> std::process::ExitStatus {
    std::process::Command::new("mkfifo").arg(path).status().unwrap()
}

/// A log swapped for a FIFO after `zcta recover` listed the run (someone hostile with
/// write access) is refused when opened, never waited on: its reader and the lock
/// check open regular files only.
#[test]
fn a_fifo_in_place_of_a_log_is_refused_not_waited_on() {
    let t = tempfile::tempdir().unwrap();
    let fifo = t.path().join("_vm-p7-00000.wal");
    assert!(mkfifo(&fifo).success());
    let (tx, rx) = std::sync::mpsc::channel();
    let f = fifo.clone();
    std::thread::spawn(move || {
        let _ = tx.send(zcta::recover::read_log(&f));
    });
    let r = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("read_log blocked on a FIFO");
    let e = r.expect_err("a FIFO read as a log");
    assert!(e.contains("not a regular file"), "{e}");
    assert_eq!(
        zcta::reader::open_regular(&fifo).map(|_| ()).unwrap_err(),
        "a FIFO: not a regular file"
    );
}

/// A process log next to its segment's file (the process died between the rename and
/// the delete) is stale: the file holds the final row where the log holds the
/// "running" one, and the process's identity (run, host, pid, start) is what they
/// share.
#[test]
fn a_process_log_beside_its_process_file_is_stale() {
    let run = Run::new("proc-stale");
    let (child, _idf) = start_loop(&run);
    std::thread::sleep(Duration::from_millis(1500));
    kill(child);
    let proc_wal = file_ending(&run.dir().join("process"), "wal");
    let final_path = zcta::sink::final_path_for_wal(&proc_wal).unwrap();
    // The file as recovery writes it (end_reason killed).
    std::fs::copy(recovered_copy(&run, &proc_wal), &final_path).unwrap();
    let r = recover(&run.dir());
    assert!(
        text(&r.stdout).contains(&format!("removed stale log {}", proc_wal.display())),
        "{}\n{}",
        text(&r.stdout),
        text(&r.stderr)
    );
    assert!(!proc_wal.exists());
}

/// A program that runs with its standard output and error closed (a daemon, a launcher
/// with closed stdio) keeps them closed: zcta's files never take descriptors 0, 1 or 2,
/// so the program's writes there fail as they would without zcta instead of landing in
/// a log (where, after a crash, they cut off its rows).
#[test]
fn closed_standard_streams_stay_closed() {
    let run = Run::new("closed-stdio");
    let idf = run.scratch("uid");
    common::write_unique_id(&idf);
    let host = run.host(&["loop", idf.to_str().unwrap()]);
    let mut cmd = std::process::Command::new("sh");
    cmd.arg("-c")
        .arg("exec \"$0\" \"$@\" <&- 1>&- 2>&-")
        .arg(host.get_program())
        .args(host.get_args())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    for (k, v) in host.get_envs() {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    let child = Looping(cmd.spawn().expect("spawn host loop"));
    let pid = child.0.id();
    let t0 = Instant::now();
    let ops = run.dir().join("ops");
    while !std::fs::read_dir(&ops).is_ok_and(|d| {
        d.flatten()
            .any(|e| e.file_name().to_string_lossy().ends_with(".wal"))
    }) {
        assert!(t0.elapsed() < Duration::from_secs(20), "no log after 20 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Long enough for every table's log and the process file to be open.
    std::thread::sleep(Duration::from_millis(1000));
    let fds: Vec<String> = (0..3)
        .filter_map(|fd| std::fs::read_link(format!("/proc/{pid}/fd/{fd}")).ok())
        .map(|p| p.display().to_string())
        .collect();
    kill(child);
    assert!(fds.is_empty(), "descriptors 0-2 of the program now: {fds:?}");
}

/// The Parquet file `zcta recover` makes of the process log `proc_wal` of `run`, in a
/// copy of the run (the run itself untouched).
fn recovered_copy(run: &Run, proc_wal: &Path) -> std::path::PathBuf {
    let other = run.scratch("other");
    std::fs::create_dir_all(other.join("process")).unwrap();
    std::fs::copy(
        proc_wal,
        other.join("process").join(proc_wal.file_name().unwrap()),
    )
    .unwrap();
    assert!(recover(&other).status.success());
    file_ending(&other.join("process"), "parquet")
}
