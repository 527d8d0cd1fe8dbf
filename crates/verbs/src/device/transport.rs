//! Device transports, and `SOFTRDMA_TRANSPORTS`, which picks and orders the transports of the
//! default device list.

use std::fmt;
use std::str::FromStr;

use crate::{Error, Result};

/// Environment variable that filters and orders the transports of the default device list:
/// a comma list such as `roce` or `roce,iwarp`. Unset or empty means every transport, in
/// [`TransportKind::ALL`] order. Ignored when `SOFTRDMA_CONFIG` names the devices.
pub const TRANSPORTS_ENV: &str = crate::settings::TRANSPORTS.name;

/// The wire transport of a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TransportKind {
    /// Soft-iWARP (RDMAP/DDP/MPA over TCP); devices are named `siw_<ifname>` by default.
    Iwarp,
    /// Soft-RoCEv2 (IBTA transport over UDP port 4791); devices are named `rxe_<ifname>`.
    Roce,
}

/// Transport names the configuration recognises but that are not implemented yet.
const PLANNED: &[&str] = &[];

impl TransportKind {
    /// Every available transport, in the order default devices are created per interface:
    /// `siw_<if>` then `rxe_<if>`.
    pub const ALL: &'static [TransportKind] = &[TransportKind::Iwarp, TransportKind::Roce];

    /// The configuration / display name: `iwarp`, `roce`.
    pub fn as_str(self) -> &'static str {
        match self {
            TransportKind::Iwarp => "iwarp",
            TransportKind::Roce => "roce",
        }
    }

    /// Prefix of default device names: `siw`, `rxe`.
    pub fn device_prefix(self) -> &'static str {
        match self {
            TransportKind::Iwarp => "siw",
            TransportKind::Roce => "rxe",
        }
    }

    /// The default device name on interface `ifname`, e.g. `siw_eth0`, `rxe_lo`.
    pub fn default_device_name(self, ifname: &str) -> String {
        format!("{}_{}", self.device_prefix(), ifname)
    }

    /// Parses a `SOFTRDMA_TRANSPORTS` value: comma-separated names (blanks around a name are
    /// ignored), each at most once, at least one. Errors (EINVAL) name the variable and the
    /// accepted values.
    pub fn parse_list(value: &str) -> Result<Vec<TransportKind>> {
        let accepted: Vec<&str> = TransportKind::ALL.iter().map(|t| t.as_str()).collect();
        let err = |what: String| {
            Error::inval(format!(
                "{TRANSPORTS_ENV}=\"{}\": {what} (accepted: a comma list of {})",
                value.escape_debug(),
                accepted.join(", ")
            ))
        };
        let mut out: Vec<TransportKind> = Vec::new();
        for name in value.split(',').map(str::trim) {
            if name.is_empty() {
                return Err(err("empty transport name".to_owned()));
            }
            let Some(&t) = TransportKind::ALL.iter().find(|t| t.as_str() == name) else {
                return Err(err(format!("unknown transport \"{}\"", name.escape_debug())));
            };
            if out.contains(&t) {
                return Err(err(format!("transport \"{name}\" is named twice")));
            }
            out.push(t);
        }
        Ok(out)
    }

    /// The transports of the default device list: `SOFTRDMA_TRANSPORTS` if it is set and
    /// non-empty (see [`TransportKind::parse_list`]), else [`TransportKind::ALL`].
    pub fn from_env() -> Result<Vec<TransportKind>> {
        match std::env::var(TRANSPORTS_ENV) {
            Ok(v) if !v.trim().is_empty() => TransportKind::parse_list(&v),
            Ok(_) | Err(std::env::VarError::NotPresent) => Ok(TransportKind::ALL.to_vec()),
            Err(std::env::VarError::NotUnicode(v)) => Err(Error::inval(format!(
                "{TRANSPORTS_ENV}={v:?}: not UTF-8 (accepted: a comma list of iwarp, roce)"
            ))),
        }
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
        assert_eq!("roce".parse::<TransportKind>(), Ok(TransportKind::Roce));
        assert_eq!(TransportKind::Iwarp.to_string(), "iwarp");
        assert_eq!(TransportKind::Roce.to_string(), "roce");
        assert_eq!(TransportKind::Iwarp.default_device_name("lo"), "siw_lo".to_owned());
        assert_eq!(TransportKind::Roce.default_device_name("eth0"), "rxe_eth0".to_owned());
        assert_eq!(TransportKind::ALL, [TransportKind::Iwarp, TransportKind::Roce]);
        let bad = "ib".parse::<TransportKind>().unwrap_err();
        assert_eq!(bad.msg, "unknown transport \"ib\" (expected \"iwarp\" or \"roce\")");
    }

    #[test]
    fn transport_lists() {
        use TransportKind::*;
        assert_eq!(TransportKind::parse_list("roce").unwrap(), [Roce]);
        assert_eq!(TransportKind::parse_list("roce,iwarp").unwrap(), [Roce, Iwarp]);
        assert_eq!(TransportKind::parse_list(" iwarp , roce ").unwrap(), [Iwarp, Roce]);
        let e = TransportKind::parse_list("roce,ib").unwrap_err();
        assert_eq!(e.errno, crate::Errno::Inval);
        assert_eq!(
            e.msg,
            "SOFTRDMA_TRANSPORTS=\"roce,ib\": unknown transport \"ib\" (accepted: a comma list of iwarp, roce)"
        );
        let e = TransportKind::parse_list("roce,,iwarp").unwrap_err();
        assert!(e.msg.contains("empty transport name"), "{}", e.msg);
        let e = TransportKind::parse_list("roce,roce").unwrap_err();
        assert!(e.msg.contains("\"roce\" is named twice"), "{}", e.msg);
    }
}
