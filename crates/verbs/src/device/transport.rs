//! Device transports. Adding soft-RoCE means one more variant here (name `roce`, device prefix
//! `rxe`) plus its entry in [`TransportKind::ALL`], and removing `roce` from `PLANNED`.

use std::fmt;
use std::str::FromStr;

use crate::{Error, Result};

/// The wire transport of a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TransportKind {
    /// Soft-iWARP (RDMAP/DDP/MPA over TCP); devices are named `siw_<ifname>` by default.
    Iwarp,
}

/// Transport names the configuration recognises but that are not implemented yet.
const PLANNED: &[&str] = &["roce"];

impl TransportKind {
    /// Every available transport, in the order default devices are created per interface.
    pub const ALL: &'static [TransportKind] = &[TransportKind::Iwarp];

    /// The configuration / display name: `iwarp`.
    pub fn as_str(self) -> &'static str {
        match self {
            TransportKind::Iwarp => "iwarp",
        }
    }

    /// Prefix of default device names: `siw`.
    pub fn device_prefix(self) -> &'static str {
        match self {
            TransportKind::Iwarp => "siw",
        }
    }

    /// The default device name on interface `ifname`, e.g. `siw_eth0`.
    pub fn default_device_name(self, ifname: &str) -> String {
        format!("{}_{}", self.device_prefix(), ifname)
    }
}

impl fmt::Display for TransportKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Parses a configuration name. Errors (EINVAL) say whether the transport is planned but not
/// available yet, or unknown.
impl FromStr for TransportKind {
    type Err = Error;

    fn from_str(s: &str) -> Result<TransportKind> {
        if let Some(t) = TransportKind::ALL.iter().find(|t| t.as_str() == s) {
            return Ok(*t);
        }
        if PLANNED.contains(&s) {
            return Err(Error::inval(format!("transport {s} is not available yet")));
        }
        let expected: Vec<String> = TransportKind::ALL.iter().map(|t| format!("\"{t}\"")).collect();
        Err(Error::inval(format!(
            "unknown transport \"{}\" (expected {})",
            s.escape_debug(),
            expected.join(" or ")
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_names() {
        assert_eq!("iwarp".parse::<TransportKind>(), Ok(TransportKind::Iwarp));
        assert_eq!(TransportKind::Iwarp.to_string(), "iwarp");
        assert_eq!(TransportKind::Iwarp.default_device_name("lo"), "siw_lo".to_owned());
        let roce = "roce".parse::<TransportKind>().unwrap_err();
        assert_eq!(roce.msg, "transport roce is not available yet");
        let bad = "ib".parse::<TransportKind>().unwrap_err();
        assert_eq!(bad.msg, "unknown transport \"ib\" (expected \"iwarp\")");
    }
}
