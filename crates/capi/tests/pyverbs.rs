//! rdma-core's own test suite (Debian's `python3-pyverbs`, 273 tests) over the drop-in, on
//! `rxe_lo` and on `siw_lo`.
//!
//! The suite is copied from `/usr/share/doc/rdma-core/tests` into the target directory,
//! gunzipped, and run by Debian's `/usr/bin/python3 run_tests.py -v --dev DEV` with
//! `LD_LIBRARY_PATH` at the drop-in. Every test's outcome (pass, skip, fail, error) is written
//! to `target/tmp/pyverbs-DEV.txt` and compared with `tests/pyverbs/baseline.txt`, kept in
//! the repo: a test that passed there must pass now, and no vendor test (mlx5, efa, cuda)
//! may fail or error (they must skip). `SOFTRDMA_PYVERBS_UPDATE=1` rewrites the baseline
//! from this run (review the diff: it must only gain passes).

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{lo_config, Proc};

const SUITE: &str = "/usr/share/doc/rdma-core/tests";
const BASELINE: &str = "tests/pyverbs/baseline.txt";
const RXE_LO: &str = "\n[[device]]\nname = \"rxe_lo\"\ntransport = \"roce\"\nnetdev = \"lo\"\n";

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Outcome {
    Pass,
    Skip,
    Fail,
    Error,
}

impl Outcome {
    fn name(self) -> &'static str {
        match self {
            Outcome::Pass => "pass",
            Outcome::Skip => "skip",
            Outcome::Fail => "fail",
            Outcome::Error => "error",
        }
    }

    fn parse(s: &str) -> Option<Outcome> {
        Some(match s {
            "pass" => Outcome::Pass,
            "skip" => Outcome::Skip,
            "fail" => Outcome::Fail,
            "error" => Outcome::Error,
            _ => return None,
        })
    }
}

/// The suite, gunzipped, in the target directory (one copy per test process).
fn suite(dev: &str) -> PathBuf {
    let src = Path::new(SUITE);
    assert!(
        src.join("run_tests.py").is_file(),
        "{SUITE}/run_tests.py is missing (install python3-pyverbs)"
    );
    let dst = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("pyverbs-suite-{dev}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dst);
    let tests = dst.join("tests");
    std::fs::create_dir_all(&tests).unwrap();
    for e in std::fs::read_dir(src).unwrap().flatten() {
        std::fs::copy(e.path(), tests.join(e.file_name())).unwrap();
    }
    let gz: Vec<PathBuf> = std::fs::read_dir(&tests)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "gz"))
        .collect();
    let r = common::run(Command::new("gunzip").arg("-f").args(&gz));
    assert_eq!(r.code, Some(0), "gunzip: {}", r.describe());
    dst
}

/// `tests.module.Class.test` → outcome, from unittest's verbose output.
fn parse(output: &str) -> BTreeMap<String, Outcome> {
    let mut out = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in output.lines() {
        if let Some(open) = line.find(" (tests.") {
            let name = &line[..open];
            if !name.is_empty() && name.chars().all(|c| c.is_alphanumeric() || c == '_') {
                if let Some(close) = line[open..].find(')') {
                    current = Some(line[open + 2..open + close].trim_start_matches("tests.").to_owned());
                }
            }
        }
        let t = line.trim_end();
        // A result on a line of its own: output of the test itself (or of the library on
        // stderr) came between the test's name and its result.
        let alone = current.is_some() && matches!(t, "ok" | "FAIL" | "ERROR" | "unexpected success");
        let outcome = if alone {
            Some(match t {
                "ok" => Outcome::Pass,
                "ERROR" => Outcome::Error,
                _ => Outcome::Fail,
            })
        } else if current.is_some() && t.starts_with("skipped '") {
            Some(Outcome::Skip)
        } else if t.ends_with(" ... ok") {
            Some(Outcome::Pass)
        } else if t.contains(" ... skipped ") {
            Some(Outcome::Skip)
        } else if t.ends_with(" ... FAIL") || t.ends_with("... unexpected success") {
            Some(Outcome::Fail)
        } else if t.ends_with(" ... ERROR") {
            Some(Outcome::Error)
        } else {
            None
        };
        if let Some(o) = outcome {
            if let Some(id) = current.take() {
                out.insert(id, o);
            }
        }
    }
    out
}

fn baseline() -> BTreeMap<(String, String), Outcome> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(BASELINE);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(f.len(), 3, "{BASELINE}: `{l}`");
            let o = Outcome::parse(f[2]).unwrap_or_else(|| panic!("{BASELINE}: `{l}`"));
            ((f[0].to_owned(), f[1].to_owned()), o)
        })
        .collect()
}

/// Tests whose outcome depends on timing here, with the reason; not held to the baseline.
const FLAKY: &[(&str, &str)] = &[];

fn is_vendor(id: &str) -> bool {
    ["test_mlx5", "test_efa", "test_cuda"].iter().any(|p| id.starts_with(p))
}

fn run_on(dev: &str) {
    let dir = suite(dev);
    let cfg = lo_config(&format!("pyverbs-config-{dev}"), RXE_LO);
    let mut cmd = Command::new("/usr/bin/python3");
    cmd.current_dir(&dir)
        .args(["tests/run_tests.py", "-v", "--dev", dev])
        .env("SOFTRDMA_CONFIG", &cfg);
    assert!(
        Path::new("/usr/bin/python3").is_file(),
        "/usr/bin/python3 is missing (install python3-pyverbs)"
    );
    let r = Proc::start(&mut cmd).wait(Duration::from_secs(600));
    let _ = std::fs::remove_dir_all(&dir);
    let text = format!("{}{}", r.stdout, r.stderr);
    let results = parse(&text);
    assert!(
        results.len() > 250,
        "only {} test outcomes found (the suite did not load?):\n{text}",
        results.len()
    );

    let mut report = String::new();
    let mut counts: BTreeMap<Outcome, usize> = BTreeMap::new();
    for (id, o) in &results {
        report.push_str(&format!("{dev} {id} {}\n", o.name()));
        *counts.entry(*o).or_default() += 1;
    }
    let current = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("pyverbs-{dev}.txt"));
    std::fs::write(&current, &report).unwrap();
    let summary = counts
        .iter()
        .map(|(o, n)| format!("{n} {}", o.name()))
        .collect::<Vec<_>>()
        .join(", ");
    eprintln!("pyverbs on {dev}: {summary} (all outcomes in {})", current.display());

    if std::env::var_os("SOFTRDMA_PYVERBS_UPDATE").is_some() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(BASELINE);
        let old = std::fs::read_to_string(&path).unwrap_or_default();
        let header: Vec<&str> = old.lines().take_while(|l| l.starts_with('#')).collect();
        let mut lines: Vec<String> = old
            .lines()
            .filter(|l| !l.starts_with('#') && !l.starts_with(&format!("{dev} ")))
            .map(str::to_owned)
            .collect();
        lines.extend(report.lines().map(str::to_owned));
        lines.sort();
        lines.dedup();
        let text = header.join("\n") + "\n" + &lines.join("\n") + "\n";
        std::fs::write(&path, text).unwrap();
        eprintln!("rewrote {}", path.display());
    }

    let mut problems = Vec::new();
    for ((bdev, id), o) in baseline() {
        if let Some((_, why)) = FLAKY.iter().find(|(f, _)| *f == id) {
            eprintln!("{id}: not held to the baseline: {why}");
            continue;
        }
        if bdev == dev && o == Outcome::Pass && results.get(&id) != Some(&Outcome::Pass) {
            problems.push(format!("{id}: passed in the baseline, now {:?}", results.get(&id)));
        }
    }
    for (id, o) in &results {
        if is_vendor(id) && matches!(o, Outcome::Fail | Outcome::Error) {
            problems.push(format!("{id}: a vendor test must skip, not {}", o.name()));
        }
    }
    assert!(
        problems.is_empty(),
        "pyverbs on {dev} ({summary}):\n  {}\n--- output\n{text}",
        problems.join("\n  ")
    );
}

#[test]
#[cfg_attr(softrdma_no_consumers, ignore = "needs python3-pyverbs (rdma-core's test suite)")]
fn pyverbs_on_rxe_lo() {
    run_on("rxe_lo");
}

#[test]
#[cfg_attr(softrdma_no_consumers, ignore = "needs python3-pyverbs (rdma-core's test suite)")]
fn pyverbs_on_siw_lo() {
    run_on("siw_lo");
}

#[test]
fn unittest_output_is_parsed() {
    let out = "test_a (tests.test_x.T.test_a) ... ok\n\
               test_b (tests.test_x.T.test_b)\nDoc line ... FAIL\n\
               test_c (tests.test_y.U.test_c) ... skipped 'no'\n\
               test_d (tests.test_y.U.test_d) ... ERROR\n\
               test_e (tests.test_z.V.test_e)\nDoc ... softrdma: some message\nok\n";
    let r = parse(out);
    assert_eq!(r.get("test_x.T.test_a"), Some(&Outcome::Pass));
    assert_eq!(r.get("test_x.T.test_b"), Some(&Outcome::Fail));
    assert_eq!(r.get("test_y.U.test_c"), Some(&Outcome::Skip));
    assert_eq!(r.get("test_y.U.test_d"), Some(&Outcome::Error));
    assert_eq!(r.get("test_z.V.test_e"), Some(&Outcome::Pass));
}
