//! Helpers for the drop-in tests: the drop-in directory, bounded child processes that are
//! killed on drop, free ports, and `SOFTRDMA_CONFIG` files.
#![allow(dead_code)]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub const LINKS: [&str; 4] = ["libibverbs.so.1", "librdmacm.so.1", "libmlx5.so.1", "libefa.so.1"];
pub const LIB: &str = "libsoftrdma.so";
/// Bound on every child process.
pub const TIMEOUT: Duration = Duration::from_secs(30);

/// The built cdylib, fresh: `cargo test` does not build a cdylib-only package's library for its
/// integration tests (a fresh clone has none, and an old one would be tested silently), so this
/// runs `cargo build -p softrdma-capi --lib` in the test executable's own target directory and
/// profile (a no-op when it is up to date; cargo does not hold its lock while tests run).
/// `SOFTRDMA_DROPIN_LIB` names a library to use instead (the ASan runs).
pub fn built_library() -> PathBuf {
    if let Some(p) = std::env::var_os("SOFTRDMA_DROPIN_LIB") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("the test executable's path");
    // <target>/<profile>/deps/<test>
    let profile_dir = exe.parent().and_then(Path::parent).expect("target/<profile>/deps");
    let target_dir = profile_dir.parent().expect("the target directory");
    let mut cargo = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cargo
        .args(["build", "-p", "softrdma-capi", "--lib", "--target-dir"])
        .arg(target_dir)
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    if profile_dir.file_name().is_some_and(|n| n == "release") {
        cargo.arg("--release");
    }
    let out = cargo
        .output()
        .unwrap_or_else(|e| panic!("cannot run cargo to build {LIB}: {e}"));
    assert!(
        out.status.success(),
        "cargo build -p softrdma-capi failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lib = profile_dir.join(LIB);
    assert!(lib.is_file(), "cargo built no {}", lib.display());
    lib
}

/// The drop-in directory of this test executable: a copy of the library plus the four
/// symlinks, made once per run (each test executable has its own, so they never race).
pub fn dropin_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("capi-dropin-{}", env!("CARGO_CRATE_NAME")));
        std::fs::create_dir_all(&dir).unwrap();
        let tmp = dir.join(format!(".{LIB}.{}", std::process::id()));
        std::fs::copy(built_library(), &tmp).unwrap();
        std::fs::rename(&tmp, dir.join(LIB)).unwrap();
        for name in LINKS {
            let link = dir.join(name);
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(LIB, &link).unwrap();
        }
        dir
    })
}

/// A finished process.
pub struct Run {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

impl Run {
    pub fn describe(&self) -> String {
        format!(
            "exit {:?} after {:?}\n--- stdout\n{}--- stderr\n{}",
            self.code, self.elapsed, self.stdout, self.stderr
        )
    }
}

/// A running child with captured output; killed and reaped on drop.
pub struct Proc {
    child: Child,
    desc: String,
    started: Instant,
    out: Option<JoinHandle<String>>,
    err: Option<JoinHandle<String>>,
}

fn reader(mut r: impl Read + Send + 'static) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = r.read_to_end(&mut s);
        String::from_utf8_lossy(&s).into_owned()
    })
}

impl Proc {
    /// Starts `cmd` with the drop-in directory in `LD_LIBRARY_PATH`.
    pub fn start(cmd: &mut Command) -> Proc {
        cmd.env("LD_LIBRARY_PATH", dropin_dir())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let desc = format!("{cmd:?}");
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("cannot run {desc}: {e}"));
        let out = reader(child.stdout.take().unwrap());
        let err = reader(child.stderr.take().unwrap());
        Proc {
            child,
            desc,
            started: Instant::now(),
            out: Some(out),
            err: Some(err),
        }
    }

    /// Waits for the exit; kills the process and fails the test after `timeout`.
    pub fn wait(self, timeout: Duration) -> Run {
        self.wait_or(timeout, "")
    }

    /// [`Proc::wait`], adding `context` (e.g. the peer's output) to the failure message.
    pub fn wait_or(mut self, timeout: Duration, context: &str) -> Run {
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                let stacks = stacks_of_tree(self.child.id());
                let _ = self.child.kill();
                let _ = self.child.wait();
                let partial = self.collect(None);
                panic!(
                    "{} did not finish within {timeout:?}\n{}{context}\n--- where it waited\n{stacks}",
                    self.desc,
                    partial.describe()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        self.collect(status.code())
    }

    /// Kills the process (for servers that never exit) and returns what it printed.
    pub fn kill(mut self) -> Run {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.collect(None)
    }

    fn collect(&mut self, code: Option<i32>) -> Run {
        let elapsed = self.started.elapsed();
        Run {
            code,
            stdout: self.out.take().map(|h| h.join().unwrap()).unwrap_or_default(),
            stderr: self.err.take().map(|h| h.join().unwrap()).unwrap_or_default(),
            elapsed,
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Where a hung process and its descendants (a forked child) wait: every thread's stack from
/// gdb, without the frames of the Rust runtime. Bounded (30 s per process).
pub fn stacks_of_tree(pid: u32) -> String {
    let mut pids = vec![pid];
    let mut i = 0;
    while i < pids.len() && pids.len() < 16 {
        if let Ok(o) = Command::new("pgrep").arg("-P").arg(pids[i].to_string()).output() {
            pids.extend(
                String::from_utf8_lossy(&o.stdout)
                    .split_whitespace()
                    .filter_map(|p| p.parse::<u32>().ok()),
            );
        }
        i += 1;
    }
    let mut out = String::new();
    for p in pids {
        let bt = Command::new("timeout")
            .args([
                "30",
                "gdb",
                "-p",
                &p.to_string(),
                "-batch",
                "-ex",
                "thread apply all bt 30",
            ])
            .stdin(Stdio::null())
            .output();
        let text = match bt {
            Ok(o) => String::from_utf8_lossy(&o.stdout).into_owned(),
            Err(e) => format!("(no stacks: gdb: {e})"),
        };
        let runtime = ["std::", "core::", "alloc::", "__rust", "<alloc::", "<core::", "<std::"];
        let frames: Vec<String> = text
            .lines()
            .filter(|l| l.starts_with("Thread ") || l.starts_with('#') || l.starts_with("(no stacks"))
            .filter(|l| !runtime.iter().any(|r| frame_function(l).starts_with(r)))
            .take(150)
            .map(|l| l.chars().take(180).collect())
            .collect();
        out += &format!("process {p}:\n{}\n", frames.join("\n"));
    }
    out
}

/// The function a gdb backtrace line names: after " in " (`#3  0x... in f (...)`), or after
/// the frame number for an inlined frame (`#4  f (...)`).
pub fn frame_function(line: &str) -> &str {
    match line.split_once(" in ") {
        Some((_, f)) => f,
        None => line.trim_start_matches(|c: char| c == '#' || c == ' ' || c.is_ascii_digit()),
    }
}

/// Runs `cmd` to completion within [`TIMEOUT`].
pub fn run(cmd: &mut Command) -> Run {
    Proc::start(cmd).wait(TIMEOUT)
}

/// The `softrdma` CLI of this workspace (cargo builds every binary before running tests).
pub fn softrdma() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let p = exe.parent().unwrap().parent().unwrap().join("softrdma");
    assert!(p.is_file(), "{} not built (run `cargo build --workspace`)", p.display());
    p
}

pub fn binary(name: &str) -> PathBuf {
    let p = Path::new("/usr/bin").join(name);
    assert!(
        p.is_file(),
        "{} is missing (install ibverbs-utils rdmacm-utils perftest)",
        p.display()
    );
    p
}

/// The `extra` lines of [`lo_config`] that add the soft-RoCE device `rxe_lo` on `lo`.
pub const RXE_LO: &str = "\n[[device]]\nname = \"rxe_lo\"\ntransport = \"roce\"\nnetdev = \"lo\"\n";

/// A `SOFTRDMA_CONFIG` file with one device `siw_lo` on `lo`, plus `extra` lines. Replaced
/// atomically (write + rename), so a process of a concurrent test never reads it half-written.
pub fn lo_config(dir_name: &str, extra: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(dir_name);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("devices.toml");
    let text = format!("[[device]]\nname = \"siw_lo\"\ntransport = \"iwarp\"\nnetdev = \"lo\"\n{extra}");
    let tmp = dir.join(format!(
        ".devices.toml.{}.{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
    path
}

/// A TCP port that was free on 127.0.0.1 a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// True once some socket listens on TCP `port` (read from /proc/net/tcp{,6}; nothing connects,
/// so the server under test sees no extra connection).
pub fn is_listening(port: u16) -> bool {
    listening_in("/proc/net", port)
}

/// True if the TCP tables in `net_dir` (`/proc/net`, or `/proc/PID/net` for the namespace of
/// process PID) show a listener on `port`.
pub fn listening_in(net_dir: &str, port: u16) -> bool {
    let want = format!(":{port:04X}");
    ["tcp", "tcp6"].iter().any(|f| {
        std::fs::read_to_string(format!("{net_dir}/{f}"))
            .unwrap_or_default()
            .lines()
            .skip(1)
            .any(|l| {
                let cols: Vec<&str> = l.split_whitespace().collect();
                // local_address is column 1, st (state) column 3; 0A = LISTEN.
                cols.len() > 3 && cols[1].ends_with(&want) && cols[3] == "0A"
            })
    })
}

/// Waits until `server` listens on `port` (panics with its output if it exits or takes
/// longer than 10 s).
pub fn wait_listening(server: &mut Proc, port: u16) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !is_listening(port) {
        if let Some(status) = server.child.try_wait().unwrap() {
            let r = server.collect(status.code());
            panic!("{} exited before listening on {port}\n{}", server.desc, r.describe());
        }
        assert!(
            Instant::now() < deadline,
            "{} is not listening on {port} after 10 s",
            server.desc
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

impl Proc {
    /// True once the process has exited (it is reaped; [`Proc::wait`] still collects it).
    pub fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }
}

/// [`wait_listening`] for a server started in another network namespace (`ip netns exec`):
/// reads the server's own `/proc/PID/net/tcp{,6}`, once the server runs in a namespace other
/// than this process's (before that, `ip` has not switched yet).
pub fn wait_listening_in_ns(server: &mut Proc, port: u16) {
    let pid = server.child.id();
    let mine = std::fs::read_link("/proc/self/ns/net").ok();
    let listening = || {
        let theirs = std::fs::read_link(format!("/proc/{pid}/ns/net")).ok();
        theirs.is_some() && theirs != mine && listening_in(&format!("/proc/{pid}/net"), port)
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !listening() {
        if let Some(status) = server.child.try_wait().unwrap() {
            let r = server.collect(status.code());
            panic!("{} exited before listening on {port}\n{}", server.desc, r.describe());
        }
        assert!(
            Instant::now() < deadline,
            "{} is not listening on {port} (in its namespace) after 10 s",
            server.desc
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// True once some process in the network namespace of `pid` (this process's if `None`)
/// listens with rdma_cm on soft-RoCE service (`ps`, `port`): the driver's service claim, an
/// abstract Unix socket named after the service ID (`ps` is the upper half of the ID, e.g.
/// 0x0106 for RDMA_PS_TCP). A RoCE listener holds no TCP socket to wait for.
pub fn rxe_listening(pid: Option<u32>, ps: u16, port: u16) -> bool {
    let name = format!("@softrdma-rxe-svc-{:016x}", (u64::from(ps) << 16) | u64::from(port));
    let table = match pid {
        Some(p) => format!("/proc/{p}/net/unix"),
        None => "/proc/net/unix".to_string(),
    };
    std::fs::read_to_string(table)
        .unwrap_or_default()
        .lines()
        .any(|l| l.split_whitespace().last() == Some(name.as_str()))
}

impl Proc {
    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

/// Compiles `tests/c/<name>.c` against the real rdma-core headers into the target directory,
/// linked with `link` (the drop-in's `libibverbs.so.1`, or `-libverbs` for Debian's own);
/// the test fails naming what to install if it does not compile. Returns the executable.
pub fn compile_c(name: &str, link: &std::ffi::OsStr) -> PathBuf {
    compile_c_linked(name, &[link])
}

/// [`compile_c`] with several libraries (e.g. `-lrdmacm -libverbs`: Debian's, which the
/// drop-in replaces at run time through `LD_LIBRARY_PATH`).
pub fn compile_c_linked(name: &str, links: &[&std::ffi::OsStr]) -> PathBuf {
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("capi-smoke");
    std::fs::create_dir_all(&out).unwrap();
    let exe = out.join(name);
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{name}.c"));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
    let build = run(Command::new(&cc)
        .args(["-std=gnu11", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(&src)
        .args(links));
    assert_eq!(
        build.code,
        Some(0),
        "compiling {} (needs libibverbs-dev, librdmacm-dev): {}",
        src.display(),
        build.describe()
    );
    exe
}
