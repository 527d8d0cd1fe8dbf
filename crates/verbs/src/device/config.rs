//! The `SOFTRDMA_CONFIG` file: an explicit device list that replaces the default one.
//!
//! ```toml
//! [[device]]
//! name = "siw_lo"
//! transport = "iwarp"  # or "roce"
//! netdev = "lo"
//! loopback = false    # optional, default true
//! ```
//!
//! Only `[[device]]` tables are allowed; unknown keys are errors. A file with no tables
//! defines zero devices. `SOFTRDMA_TRANSPORTS` (see
//! [`TRANSPORTS_ENV`](super::TRANSPORTS_ENV)) only shapes the default list: with a
//! configuration file it is ignored. Every error is EINVAL and names the file and the line: toml's own
//! errors point at the offending text, semantic errors at the `[[device]]` table.

use std::path::Path;

use serde::Deserialize;
use toml::Spanned;

use super::transport::TransportKind;
use crate::{Error, Result};

/// Environment variable naming the configuration file.
pub const CONFIG_ENV: &str = crate::settings::CONFIG.name;

/// Longest device name (`IB_DEVICE_NAME_MAX` is 64 including the NUL).
const MAX_NAME_LEN: usize = 63;

/// One `[[device]]` table, checked except for whether its netdev exists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceSpec {
    /// Device name, e.g. `siw_lo`.
    pub name: String,
    /// Transport (`transport = "iwarp"` or `"roce"`).
    pub transport: TransportKind,
    /// The interface the device sits on.
    pub netdev: String,
    /// Whether the device can reach its own host (LOOPBACK.md R2); default true.
    pub loopback: bool,
    /// 1-based line of the table in the file, for error messages.
    pub line: usize,
}

/// A parsed configuration file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Where it came from (the path), used as the prefix of every error message.
    pub origin: String,
    /// The devices, in file order.
    pub devices: Vec<DeviceSpec>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    device: Vec<Spanned<RawDevice>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDevice {
    name: String,
    transport: String,
    netdev: String,
    #[serde(default = "default_loopback")]
    loopback: bool,
}

fn default_loopback() -> bool {
    true
}

impl Config {
    /// Reads and parses the file at `path`; an unreadable file is EINVAL too.
    pub fn load(path: &Path) -> Result<Config> {
        let origin = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| match e.raw_os_error() {
            // Out of fds or memory is not a bad file: say so with its own errno.
            Some(libc::EMFILE | libc::ENFILE | libc::ENOMEM) => {
                Error::os(format_args!("{CONFIG_ENV}={origin}: cannot read"), &e)
            }
            _ => Error::inval(format!("{CONFIG_ENV}={origin}: cannot read: {e}")),
        })?;
        Config::parse(&origin, &text)
    }

    /// Parses `text`; `origin` (normally the path) prefixes error messages.
    pub fn parse(origin: &str, text: &str) -> Result<Config> {
        let raw: RawFile = toml::from_str(text).map_err(|e| {
            let msg = e.message().trim().replace('\n', "; ");
            match e.span() {
                Some(span) => {
                    let (line, col) = line_col(text, span.start);
                    Error::inval(format!("{origin}: line {line}, column {col}: {msg}"))
                }
                None => Error::inval(format!("{origin}: {msg}")),
            }
        })?;
        let mut devices: Vec<DeviceSpec> = Vec::with_capacity(raw.device.len());
        for table in raw.device {
            let line = line_col(text, table.span().start).0;
            let d = table.into_inner();
            let err = |what: String| Error::inval(format!("{origin}: line {line}: {what}"));
            check_name(&d.name).map_err(|e| err(e.msg))?;
            if let Some(first) = devices.iter().find(|s| s.name == d.name) {
                return Err(err(format!(
                    "duplicate device name \"{}\" (first defined at line {})",
                    d.name, first.line
                )));
            }
            let transport: TransportKind = d
                .transport
                .parse()
                .map_err(|e: Error| err(format!("device \"{}\": {}", d.name, e.msg)))?;
            if d.netdev.is_empty() {
                return Err(err(format!("device \"{}\": netdev is empty", d.name)));
            }
            devices.push(DeviceSpec {
                name: d.name,
                transport,
                netdev: d.netdev,
                loopback: d.loopback,
                line,
            });
        }
        Ok(Config {
            origin: origin.to_owned(),
            devices,
        })
    }

    /// An EINVAL error about `spec`, naming this file and the spec's line.
    pub fn error_at(&self, spec: &DeviceSpec, what: impl std::fmt::Display) -> Error {
        Error::inval(format!("{}: line {}: {}", self.origin, spec.line, what))
    }
}

fn check_name(name: &str) -> Result<()> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.');
    if name.is_empty() {
        crate::bail!(Inval, "device name is empty");
    }
    if name.len() > MAX_NAME_LEN {
        crate::bail!(Inval, "device name \"{name}\" is longer than {MAX_NAME_LEN} bytes");
    }
    if !name.chars().all(ok_char) {
        crate::bail!(
            Inval,
            "device name \"{}\" may only contain letters, digits, '_', '-' and '.'",
            name.escape_debug()
        );
    }
    Ok(())
}

/// 1-based (line, column) of byte offset `pos` in `text`.
fn line_col(text: &str, pos: usize) -> (usize, usize) {
    let before = &text.as_bytes()[..pos.min(text.len())];
    let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
    let line_start = before.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    let col = String::from_utf8_lossy(&before[line_start..]).chars().count() + 1;
    (line, col)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config> {
        Config::parse("/etc/softrdma.toml", text)
    }

    #[test]
    fn good_file() {
        let cfg = parse(
            "# two devices\n\
             [[device]]\n\
             name = \"siw_lo\"\n\
             transport = \"iwarp\"\n\
             netdev = \"lo\"\n\
             \n\
             [[device]]\n\
             name = \"siw_eth0\"\n\
             transport = \"iwarp\"\n\
             netdev = \"eth0\"\n\
             loopback = false\n",
        )
        .unwrap();
        assert_eq!(cfg.origin, "/etc/softrdma.toml");
        assert_eq!(
            cfg.devices,
            vec![
                DeviceSpec {
                    name: "siw_lo".into(),
                    transport: TransportKind::Iwarp,
                    netdev: "lo".into(),
                    loopback: true,
                    line: 2,
                },
                DeviceSpec {
                    name: "siw_eth0".into(),
                    transport: TransportKind::Iwarp,
                    netdev: "eth0".into(),
                    loopback: false,
                    line: 7,
                },
            ]
        );
    }

    #[test]
    fn empty_file_means_no_devices() {
        assert!(parse("").unwrap().devices.is_empty());
        assert!(parse("# nothing\n").unwrap().devices.is_empty());
    }

    #[test]
    fn unknown_key_names_its_line() {
        let e =
            parse("[[device]]\nname = \"a\"\ntransport = \"iwarp\"\nnetdev = \"lo\"\nloopbak = true\n").unwrap_err();
        assert_eq!(e.errno, crate::Errno::Inval);
        assert!(e.msg.starts_with("/etc/softrdma.toml: line 5, column 1: "), "{}", e.msg);
        assert!(e.msg.contains("unknown field `loopbak`"), "{}", e.msg);
    }

    #[test]
    fn unknown_top_level_table_names_its_line() {
        let e = parse("\n[defaults]\nloopback = true\n").unwrap_err();
        assert!(e.msg.contains("line 2"), "{}", e.msg);
        assert!(e.msg.contains("unknown field `defaults`"), "{}", e.msg);
    }

    #[test]
    fn syntax_error_names_its_line() {
        let e = parse("[[device]]\nname = \"a\"\nnetdev = \n").unwrap_err();
        assert!(e.msg.contains("line 3"), "{}", e.msg);
        assert!(!e.msg.contains('\n'), "{}", e.msg);
    }

    #[test]
    fn wrong_type_names_its_line() {
        let e =
            parse("[[device]]\nname = \"a\"\ntransport = \"iwarp\"\nnetdev = \"lo\"\nloopback = \"no\"\n").unwrap_err();
        assert!(e.msg.contains("line 5"), "{}", e.msg);
    }

    #[test]
    fn bad_transport_names_the_table_line() {
        let e = parse(
            "[[device]]\nname = \"a\"\ntransport = \"iwarp\"\nnetdev = \"lo\"\n\n\
             [[device]]\nname = \"b\"\ntransport = \"infiniband\"\nnetdev = \"lo\"\n",
        )
        .unwrap_err();
        assert_eq!(
            e.msg,
            "/etc/softrdma.toml: line 6: device \"b\": unknown transport \"infiniband\" \
             (expected \"iwarp\" or \"roce\")"
        );
    }

    #[test]
    fn roce_devices_are_accepted() {
        let cfg = parse("[[device]]\nname = \"rxe_lo\"\ntransport = \"roce\"\nnetdev = \"lo\"\n").unwrap();
        assert_eq!(cfg.devices[0].transport, TransportKind::Roce);
        assert_eq!(cfg.devices[0].name, "rxe_lo");
    }

    #[test]
    fn missing_netdev_names_the_table_line() {
        let e = parse(
            "[[device]]\nname = \"a\"\ntransport = \"iwarp\"\nnetdev = \"lo\"\n\n\
             [[device]]\nname = \"b\"\ntransport = \"iwarp\"\n",
        )
        .unwrap_err();
        assert!(e.msg.contains("line 6"), "{}", e.msg);
        assert!(e.msg.contains("missing field `netdev`"), "{}", e.msg);
    }

    #[test]
    fn duplicate_name_names_both_lines() {
        let e = parse(
            "[[device]]\nname = \"a\"\ntransport = \"iwarp\"\nnetdev = \"lo\"\n\
             [[device]]\nname = \"a\"\ntransport = \"iwarp\"\nnetdev = \"eth0\"\n",
        )
        .unwrap_err();
        assert_eq!(
            e.msg,
            "/etc/softrdma.toml: line 5: duplicate device name \"a\" (first defined at line 1)"
        );
    }

    #[test]
    fn bad_names_are_rejected() {
        for name in ["", "a b", "x/y", &"n".repeat(64)] {
            let text = format!("[[device]]\nname = \"{name}\"\ntransport = \"iwarp\"\nnetdev = \"lo\"\n");
            let e = parse(&text).unwrap_err();
            assert!(e.msg.contains("line 1"), "{}", e.msg);
        }
        let e = parse("[[device]]\nname = \"a\"\ntransport = \"iwarp\"\nnetdev = \"\"\n").unwrap_err();
        assert!(e.msg.ends_with("netdev is empty"), "{}", e.msg);
    }

    #[test]
    fn line_col_counts_from_one() {
        assert_eq!(line_col("abc", 0), (1, 1));
        assert_eq!(line_col("a\nbc", 3), (2, 2));
        assert_eq!(line_col("a\n", 99), (2, 1));
    }

    #[test]
    fn load_names_the_path_when_unreadable() {
        let e = Config::load(Path::new("/nonexistent/softrdma.toml")).unwrap_err();
        assert!(e.msg.contains("/nonexistent/softrdma.toml"), "{}", e.msg);
    }
}
