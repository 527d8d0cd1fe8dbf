//! `softrdma completions SHELL` and `softrdma man`: generated from the clap definition, they
//! name every subcommand `softrdma --help` lists, and the man page is roff that groff renders
//! without a warning.

use std::process::Command;

fn softrdma(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_softrdma"))
        .args(args)
        .output()
        .expect("run softrdma");
    assert!(
        out.status.success(),
        "softrdma {args:?}: {:?}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

/// The subcommands `softrdma --help` lists (its `Commands:` block), `help` aside.
fn subcommands() -> Vec<String> {
    let help = softrdma(&["--help"]);
    let names: Vec<String> = help
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .filter(|n| n != "help")
        .collect();
    for want in ["devices", "perf", "run", "env", "completions", "man"] {
        assert!(
            names.iter().any(|n| n == want),
            "`{want}` missing from --help's commands: {names:?}"
        );
    }
    names
}

#[test]
fn completions_name_every_subcommand() {
    let subs = subcommands();
    for shell in ["bash", "zsh", "fish"] {
        let script = softrdma(&["completions", shell]);
        for sub in &subs {
            assert!(script.contains(sub.as_str()), "{shell} completions lack `{sub}`");
        }
    }
    let bash = softrdma(&["completions", "bash"]);
    assert!(
        bash.contains("complete -F _softrdma"),
        "not a bash completion script:\n{bash}"
    );
    let out = Command::new("bash").args(["-n", "-c", &bash]).output().expect("bash");
    assert!(
        out.status.success(),
        "bash -n: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn man_page_is_roff_with_a_section_per_subcommand() {
    let page = softrdma(&["man"]);
    let th = page.lines().find(|l| l.starts_with(".TH ")).expect("a .TH line");
    assert!(th.starts_with(".TH softrdma 1"), "{th}");
    for section in ["NAME", "SYNOPSIS", "DESCRIPTION", "OPTIONS"] {
        assert!(page.lines().any(|l| l == format!(".SH {section}")), "no .SH {section}");
    }
    for sub in subcommands() {
        let title = format!(".SH \"SOFTRDMA {}\"", sub.to_uppercase());
        assert!(page.lines().any(|l| l == title), "no section {title}");
    }
}

#[test]
#[cfg_attr(softrdma_no_groff, ignore = "groff is not installed (apt-get install groff-base)")]
fn man_page_renders_without_warnings() {
    let page = softrdma(&["man"]);
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("softrdma-{}.1", std::process::id()));
    std::fs::write(&path, &page).expect("write the page");
    // -k: preconv (UTF-8 input, as man(1) does); -ww: all warnings; -z: only the diagnostics
    let out = Command::new("groff")
        .args(["-k", "-man", "-Tutf8", "-ww", "-z"])
        .arg(&path)
        .output()
        .expect("run groff");
    let _ = std::fs::remove_file(&path);
    assert!(out.status.success(), "groff: {:?}", out.status);
    assert!(
        out.stderr.is_empty(),
        "groff warnings:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = Command::new("groff")
        .args(["-k", "-man", "-Tutf8"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().expect("stdin").write_all(page.as_bytes())?;
            c.wait_with_output()
        })
        .expect("render with groff");
    // grotty marks bold by overstriking (`S\bS`): keep the last character of each pair
    let mut plain = String::new();
    for c in String::from_utf8_lossy(&text.stdout).chars() {
        if c == '\u{8}' {
            plain.pop();
        } else {
            plain.push(c);
        }
    }
    let text = plain;
    assert!(
        text.contains("SOFTRDMA RUN"),
        "rendered page lacks the run section:\n{text}"
    );
}
