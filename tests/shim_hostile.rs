//! What a program does to its own process never turns zcta against it: descriptors it
//! closes and reuses, a stderr that is a closed pipe or one of its files, a small
//! thread stack for its first NCCL call, `exec` in place, data-loader children that
//! outlive it, a run directory where someone planted links, a closed umask and an
//! address-space limit.
//!
//! Needs the shim: `cargo build -p zcta-shim` before `cargo test`.

mod common;
mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use support::{Run, host_plain, text};

fn recover(run_dir: &Path) -> Output {
    let mut c = support::clean_cmd(env!("CARGO_BIN_EXE_zcta"));
    c.arg("recover").arg(run_dir);
    c.output().expect("running zcta recover")
}

fn wait_for(what: &str, mut ok: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !ok() {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A program that closes every descriptor from 3 up and opens its own files, which
/// take zcta's numbers: zcta writes nothing into them, and a child it forks then (whose
/// fork handler lets go of the parent's locked logs) leaves them to it too.
#[test]
fn descriptors_the_program_closed_and_reused_are_left_to_it() {
    for fork in [false, true] {
        closefds_run(fork);
    }
}

fn closefds_run(fork: bool) {
    let run = Run::new("closefds");
    let files = run.scratch("files");
    std::fs::create_dir_all(&files).unwrap();
    let args = ["closefds", files.to_str().unwrap(), "16", "3000"];
    let out = run
        .host(&args)
        .env("HOST_FORK_AFTER", if fork { "1" } else { "0" })
        .output()
        .unwrap();
    assert!(out.status.success(), "{:?}: {}", out.status, text(&out.stderr));
    for i in 0..16 {
        let f = files.join(format!("f{i:02}"));
        let got = std::fs::read(&f).unwrap();
        assert_eq!(
            text(&got),
            format!("line {i}\n{}", if fork { "child\n" } else { "" }),
            "{} holds {} bytes: zcta wrote into the program's file",
            f.display(),
            got.len()
        );
    }
    // zcta says once that its files were taken from it, and the process row says so.
    let err = text(&out.stderr);
    assert!(err.contains("was closed by the program"), "{err}");
    let p = run.rows("process");
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].str("end_reason"), Some("error"));
}

#[test]
fn a_warning_never_goes_into_a_file_that_took_stderr_s_number() {
    let run = Run::new("unused");
    let file = run.scratch("mine.txt");
    let mut c = host_plain(&["stderr_reused", file.to_str().unwrap()]);
    // No run id: the shim has a warning to give.
    support::preload(&mut c).env("ZCTA_OUT", run.out_dir());
    let out = c.output().unwrap();
    assert!(out.status.success(), "{:?}", out.status);
    assert_eq!(text(&std::fs::read(&file).unwrap()), "mine\n");
}

#[test]
fn a_warning_into_a_closed_pipe_does_not_kill_the_program() {
    let run = Run::new("unused");
    let (r, w) = std::io::pipe().unwrap();
    drop(r);
    let mut c = host_plain(&["small_stack", "256"]);
    // No run id: the shim has a warning to give, into the closed pipe.
    support::preload(&mut c)
        .env("ZCTA_OUT", run.out_dir())
        .stderr(Stdio::from(w));
    let st = c.status().unwrap();
    assert_eq!(st.code(), Some(0), "{st:?} (killed by SIGPIPE?)");
}

#[test]
fn a_first_call_on_a_small_stack_works() {
    for kb in ["16", "32"] {
        let run = Run::new("stack");
        let out = run.host(&["small_stack", kb]).output().unwrap();
        support::assert_ok(&out, &["small_stack", kb]);
        assert_eq!(run.rows("ops").len(), 1, "{kb} KiB");
    }
}

#[test]
fn exec_in_place_closes_the_files_first() {
    let run = Run::new("execself");
    let args = ["exec_self", "500", "/bin/true"];
    let out = run.host(&args).output().unwrap();
    support::assert_ok(&out, &args);
    let files = support::list_files(&run.dir());
    assert!(files.iter().all(|f| !f.contains("/_")), "leftovers: {files:?}");
    assert_eq!(run.rows("ops").len(), 500);
    let p = run.rows("process");
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].str("end_reason"), Some("exec"));
    assert_eq!(p[0].u64("ops_rows"), Some(500));
}

#[test]
fn a_killed_parent_s_logs_are_recoverable_while_its_child_lives() {
    let run = Run::new("forkhold");
    let mut child = run
        .host(&["fork_hold", "30"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    let kid: i32 = line.trim().strip_prefix("forked ").expect(&line).parse().unwrap();
    child.kill().unwrap();
    let _ = child.wait();
    let out = recover(&run.dir());
    // The stand-in's own child ends, whatever the assertions say.
    let _ = std::process::Command::new("kill")
        .args(["-9", &kid.to_string()])
        .status();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let said = text(&out.stdout) + &text(&out.stderr);
    assert!(!said.contains("holds its lock"), "{said}");
    assert_eq!(run.rows("ops").len(), 100, "{said}");
    let p = run.rows("process");
    assert_eq!(p[0].str("end_reason"), Some("killed"));
}

#[test]
fn links_planted_in_the_run_directory_are_neither_followed_nor_replaced() {
    let run = Run::new("planted");
    let idf = run.scratch("uid");
    common::write_unique_id(&idf);
    let victim = run.scratch("victim");
    std::fs::write(&victim, b"precious user data\n").unwrap();
    let args = ["ops", "0", "1", idf.to_str().unwrap(), "400"];
    let child = run
        .host(&args)
        .env("HOST_ITER_GAP_MS", "10")
        .env("ZCTA_SEGMENT_SECS", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The names to come follow from the process log's, which is there at once.
    let proc_dir = run.dir().join("process");
    let mut prefix = String::new();
    wait_for("the process log", || {
        let Ok(rd) = std::fs::read_dir(&proc_dir) else {
            return false;
        };
        for e in rd.flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            if let Some(p) = n.strip_prefix('_').and_then(|n| n.strip_suffix(".wal")) {
                prefix = p.to_string();
                return true;
            }
        }
        false
    });
    let ops = run.dir().join("ops");
    std::fs::create_dir_all(&ops).unwrap();
    let mut planted = vec![proc_dir.join(format!("_{prefix}.parquet.tmp"))];
    for seg in 1..=6 {
        planted.push(ops.join(format!("_{prefix}-{seg:05}.wal")));
        planted.push(ops.join(format!("_{prefix}-{seg:05}.parquet.tmp")));
        planted.push(ops.join(format!("{prefix}-{seg:05}.parquet")));
    }
    for p in &planted {
        std::os::unix::fs::symlink(&victim, p).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{:?}", out.status);
    let kept = std::fs::read(&victim).unwrap();
    assert!(
        kept == b"precious user data\n",
        "the link's target was written: {} bytes",
        kept.len()
    );
    for p in &planted {
        let m = std::fs::symlink_metadata(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        assert!(m.file_type().is_symlink(), "{} was replaced", p.display());
    }
}

#[test]
fn directories_made_under_a_closed_umask_stay_usable_by_their_owner() {
    let run = Run::new("umask");
    let out_dir = run.out_dir().join("made");
    let idf = run.scratch("uid");
    common::write_unique_id(&idf);
    // umask 0777 for the program (through sh: the test harness's own stays as it is).
    let host = common::fixtures().host.to_str().unwrap().to_string();
    let mut c = support::clean_cmd("sh");
    c.args(["-c", "umask 0777 && exec \"$0\" \"$@\"", &host, "ops", "0", "1"])
        .arg(&idf)
        .arg("2");
    support::preload(&mut c)
        .env("ZCTA_OUT", &out_dir)
        .env("ZCTA_RUN_ID", "u");
    let out = c.output().unwrap();
    support::assert_ok(&out, &["ops under umask 0777"]);
    for d in ["", "u", "u/ops", "u/process"] {
        let mode = std::fs::metadata(out_dir.join(d)).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "{}: {mode:o}", out_dir.join(d).display());
    }
}

#[test]
fn an_address_space_limit_turns_recording_off_not_the_program() {
    let run = Run::new("rlimit");
    let idf = run.scratch("uid");
    common::write_unique_id(&idf);
    let host = common::fixtures().host.to_str().unwrap().to_string();
    // Room for the program with the shim loaded (the stand-in takes about 80 MB of
    // address space), not for what recording would take.
    let vm_kib = 120 * 1024;
    let mut c = support::clean_cmd("sh");
    c.args([
        "-c",
        &format!("ulimit -v {vm_kib} && exec \"$0\" \"$@\""),
        &host,
        "ops",
        "0",
        "1",
    ])
    .arg(&idf)
    .arg("20");
    run.apply(&mut c);
    let out = c.output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{:?}: {}",
        out.status,
        text(&out.stderr)
    );
    assert_eq!(text(&out.stdout), "ok\n");
    let err = text(&out.stderr);
    assert!(
        err.contains("RLIMIT_AS") && err.contains("recording disabled"),
        "{err}"
    );
    assert!(!run.dir().exists(), "nothing written");
}
