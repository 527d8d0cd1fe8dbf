//! `softrdma completions SHELL` and `softrdma man`: shell completions (clap_complete) and a roff
//! man page (clap_mangen), both generated from the same clap definition as `--help`, so they
//! cannot drift from the real options. `cargo xtask install` writes them next to the binary.

use std::io::Write;

use clap::Args;
use clap_complete::Shell;

use crate::CmdResult;

#[derive(Args)]
pub struct CompletionsArgs {
    /// The shell to generate completions for.
    #[arg(value_enum)]
    shell: Shell,
}

#[derive(Args)]
pub struct ManArgs {}

/// Prints the completion script of `args.shell` for `cmd` on stdout.
///
/// bash: `softrdma completions bash > ~/.local/share/bash-completion/completions/softrdma`;
/// zsh: into a directory of `$fpath` as `_softrdma`; fish: `~/.config/fish/completions/softrdma.fish`.
pub fn completions(args: &CompletionsArgs, mut cmd: clap::Command) -> CmdResult {
    let mut out = Vec::new();
    clap_complete::generate(args.shell, &mut cmd, "softrdma", &mut out);
    std::io::stdout().lock().write_all(&out)?;
    Ok(())
}

/// Prints `softrdma(1)` in roff on stdout: `softrdma man | man -l -`.
pub fn man(_args: &ManArgs, cmd: clap::Command) -> CmdResult {
    let mut out = Vec::new();
    render_man(cmd, &mut out)?;
    std::io::stdout().lock().write_all(&out)?;
    Ok(())
}

/// One page: the whole command, then a section per subcommand (synopsis, description and
/// options), so that `man softrdma` documents `softrdma perf`, `softrdma run`, ... too.
fn render_man(cmd: clap::Command, out: &mut Vec<u8>) -> std::io::Result<()> {
    let cmd = cmd.disable_help_subcommand(true);
    let man = clap_mangen::Man::new(cmd.clone());
    man.render_title(out)?;
    man.render_name_section(out)?;
    man.render_synopsis_section(out)?;
    man.render_description_section(out)?;
    man.render_options_section(out)?;
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        let name = format!("softrdma {}", sub.get_name());
        let page = clap_mangen::Man::new(sub.clone().bin_name(name.clone()));
        // Each subcommand as a section of the one page: its synopsis, description and options,
        // the subpage's own section headers demoted to subsection headers.
        let mut part = Vec::new();
        page.render_synopsis_section(&mut part)?;
        page.render_description_section(&mut part)?;
        page.render_options_section(&mut part)?;
        writeln!(out, ".SH \"{}\"", name.to_uppercase())?;
        for line in String::from_utf8_lossy(&part).lines() {
            match line.strip_prefix(".SH ") {
                Some(rest) => writeln!(out, ".SS {rest}")?,
                None => writeln!(out, "{line}")?,
            }
        }
    }
    man.render_version_section(out)?;
    Ok(())
}
