//! Every `SOFTRDMA_*` environment variable the library and the CLI read, in one typed table.
//!
//! Code reads a variable only through its [`Var`] here (a test checks that no source file
//! names another `SOFTRDMA_` variable), and `softrdma --help` prints [`help_text`]. A value
//! that does not parse is reported once as a warning naming the variable, and the default
//! applies.

use std::str::FromStr;

/// One environment variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Var {
    /// The name, e.g. `SOFTRDMA_CONFIG`.
    pub name: &'static str,
    /// What a value looks like, e.g. `PATH` or `0|1`.
    pub value: &'static str,
    /// What applies when it is unset.
    pub default: &'static str,
    /// What it does.
    pub about: &'static str,
}

impl Var {
    /// The value, if set and not empty.
    pub fn text(&self) -> Option<String> {
        std::env::var(self.name).ok().filter(|v| !v.is_empty())
    }

    /// The value as an OS string (paths), if set and not empty.
    pub fn os(&self) -> Option<std::ffi::OsString> {
        std::env::var_os(self.name).filter(|v| !v.is_empty())
    }

    /// True if the value is exactly `1`.
    pub fn is_on(&self) -> bool {
        self.text().is_some_and(|v| v == "1")
    }

    /// True if the value is exactly `value`.
    pub fn is(&self, value: &str) -> bool {
        self.text().is_some_and(|v| v == value)
    }

    /// The value parsed as `T`; None if unset, or (with a warning naming the variable) if it
    /// does not parse.
    pub fn parse<T: FromStr>(&self) -> Option<T> {
        let v = self.text()?;
        match v.trim().parse() {
            Ok(t) => Some(t),
            Err(_) => {
                tracing::warn!(
                    "{}={v:?} is not {} (expected {}); using the default: {}",
                    self.name,
                    self.value,
                    self.value,
                    self.default
                );
                None
            }
        }
    }
}

/// A devices.toml that replaces the discovered device list.
pub const CONFIG: Var = Var {
    name: "SOFTRDMA_CONFIG",
    value: "PATH",
    default: "devices discovered from the interfaces",
    about: "a devices.toml file that replaces the device list ([[device]] name, transport, netdev, loopback)",
};
/// Which transports get devices, in which order.
pub const TRANSPORTS: Var = Var {
    name: "SOFTRDMA_TRANSPORTS",
    value: "iwarp,roce",
    default: "iwarp,roce",
    about: "the transports that get devices, in order (rdma_cm picks the first device of an address)",
};
/// Print every failing C call with its reason.
pub const DEBUG: Var = Var {
    name: "SOFTRDMA_DEBUG",
    value: "0|1",
    default: "0",
    about: "print every failing call of the drop-in library with its reason",
};
/// Silence the one-line hints.
pub const QUIET: Var = Var {
    name: "SOFTRDMA_QUIET",
    value: "0|1",
    default: "0",
    about: "do not print the one-line hints of errors a user can fix (the errno stays)",
};
/// The tracing filter.
pub const LOG: Var = Var {
    name: "SOFTRDMA_LOG",
    value: "FILTER",
    default: "warn (the CLI also reads RUST_LOG)",
    about: "diagnostics on stderr, tracing env-filter syntax (e.g. debug, softrdma_roce=trace)",
};
/// Print RoCE QP counters at destroy.
pub const STATS: Var = Var {
    name: "SOFTRDMA_STATS",
    value: "0|1",
    default: "0",
    about: "print each soft-RoCE QP's transport counters when it is destroyed (live: softrdma stat)",
};
/// IB CM response timeout.
pub const CM_TIMEOUT_MS: Var = Var {
    name: "SOFTRDMA_CM_TIMEOUT_MS",
    value: "a number of milliseconds",
    default: "rdma_cm's, about 4 s a try on RoCE (from the packet lifetime and the CM response timeout)",
    about: "how long the IB CM (RoCE) waits for the answer to a REQ, REP, DREQ or SIDR_REQ before it resends it",
};
/// IB CM retries.
pub const CM_RETRIES: Var = Var {
    name: "SOFTRDMA_CM_RETRIES",
    value: "a count, 0 to 15",
    default: "15 (rdma_cm's)",
    about: "how often the IB CM (RoCE) resends a REQ, REP, DREQ or SIDR_REQ before the connection fails",
};
/// MPA peer-to-peer mode.
pub const IWARP_P2P: Var = Var {
    name: "SOFTRDMA_IWARP_P2P",
    value: "0|1",
    default: "0",
    about: "an iWARP initiator asks for MPA peer-to-peer mode with an RTR (for RNICs that need it)",
};
/// MPA CRC.
pub const MPA_CRC: Var = Var {
    name: "SOFTRDMA_MPA_CRC",
    value: "0|1",
    default: "0",
    about: "iWARP connections ask for MPA CRC32c",
};
/// RoCE keepalive interval.
pub const ROCE_KEEPALIVE_MS: Var = Var {
    name: "SOFTRDMA_ROCE_KEEPALIVE_MS",
    value: "a number of milliseconds",
    default: "2000 (0 turns it off)",
    about: "how long an idle RC QP on RoCE waits before it probes its peer",
};
/// RoCE UDP port.
pub const ROCE_PORT: Var = Var {
    name: "SOFTRDMA_ROCE_PORT",
    value: "a UDP port",
    default: "4791",
    about: "the UDP port of soft-RoCE (RoCEv2 uses 4791; another port reaches only softrdma peers set alike)",
};
/// Same-host RoCE delivery.
pub const ROCE_LOCAL: Var = Var {
    name: "SOFTRDMA_ROCE_LOCAL",
    value: "direct|standard",
    default: "direct",
    about: "same-host soft-RoCE packets go straight to the owner process (direct) or through port 4791 (standard)",
};
/// RoCE over IPv6.
pub const ROCE_IPV6: Var = Var {
    name: "SOFTRDMA_ROCE_IPV6",
    value: "0|1",
    default: "1",
    about: "0: soft-RoCE opens IPv4 sockets only (no IPv6 GIDs are usable)",
};
/// UDP segmentation offload for same-host RoCE.
pub const ROCE_GSO: Var = Var {
    name: "SOFTRDMA_ROCE_GSO",
    value: "0|1",
    default: "1",
    about: "0: same-host soft-RoCE sends one datagram per packet and reads without UDP_GRO (1: runs of equal-size packets to a loopback address go as one UDP_SEGMENT send)",
};
/// Where `softrdma run` / `softrdma env` find the drop-in.
pub const DROPIN_DIR: Var = Var {
    name: "SOFTRDMA_DROPIN_DIR",
    value: "DIR",
    default: "beside the softrdma binary (lib/softrdma)",
    about: "the directory with the drop-in libibverbs.so.1 and librdmacm.so.1 (softrdma run, softrdma env)",
};

/// Variables that were retired, and why: set, each is ignored with a one-line notice on
/// stderr (unless `SOFTRDMA_QUIET=1`), once per process ([`notice_retired`]).
pub const RETIRED: &[(&str, &str)] = &[(
    "SOFTRDMA_POLL",
    "retired on 2026-12-07: a spinning progress thread made every workload measured slower \
     (perftest latency 8-100x, CM cycles 20-50 %), so the progress thread sleeps when idle",
)];

/// Prints the notice of each retired variable that is set (see [`RETIRED`]), once.
pub fn notice_retired() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        for (name, why) in RETIRED {
            if std::env::var_os(name).is_some() && !QUIET.is_on() {
                eprintln!("softrdma: {name} is set but ignored: {why}");
            }
        }
    });
}

/// Every variable, in the order `--help` lists them.
pub const ALL: &[Var] = &[
    CONFIG,
    TRANSPORTS,
    DEBUG,
    QUIET,
    LOG,
    STATS,
    CM_TIMEOUT_MS,
    CM_RETRIES,
    IWARP_P2P,
    MPA_CRC,
    ROCE_KEEPALIVE_MS,
    ROCE_PORT,
    ROCE_LOCAL,
    ROCE_IPV6,
    ROCE_GSO,
    DROPIN_DIR,
];

/// The table for `--help`: one entry per variable.
pub fn help_text() -> String {
    let mut s = String::from("Environment (read by the library and by this tool):\n");
    for v in ALL {
        s += &format!("  {}={}\n      {} [default: {}]\n", v.name, v.value, v.about, v.default);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No source file reads a `SOFTRDMA_` variable that is not in the table (test-only
    /// variables live under `tests/`, and the fuzz and xtask crates are tools).
    #[test]
    fn every_variable_the_sources_name_is_in_the_table() {
        let crates = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut unknown = Vec::new();
        let mut stack = vec![crates];
        while let Some(dir) = stack.pop() {
            for e in std::fs::read_dir(&dir).unwrap().flatten() {
                let p = e.path();
                if p.is_dir() {
                    if !matches!(
                        p.file_name().and_then(|n| n.to_str()),
                        Some("tests" | "target" | "examples")
                    ) {
                        stack.push(p);
                    }
                    continue;
                }
                if p.extension().is_none_or(|x| x != "rs") || p.ends_with("settings.rs") {
                    continue;
                }
                let text = std::fs::read_to_string(&p).unwrap();
                let mut rest = text.as_str();
                while let Some(i) = rest.find("SOFTRDMA_") {
                    let tail = &rest[i..];
                    let end = tail
                        .find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
                        .unwrap_or(tail.len());
                    let name = &tail[..end];
                    if !ALL.iter().any(|v| v.name == name) && !name.ends_with('_') {
                        unknown.push(format!("{}: {name}", p.display()));
                    }
                    rest = &tail[end..];
                }
            }
        }
        assert!(unknown.is_empty(), "variables missing from settings::ALL: {unknown:#?}");
    }

    #[test]
    fn a_malformed_value_falls_back_to_the_default() {
        const V: Var = Var {
            name: "SOFTRDMA_SETTINGS_UNIT_TEST",
            value: "a number",
            default: "7",
            about: "",
        };
        std::env::set_var(V.name, "12");
        assert_eq!(V.parse::<u16>(), Some(12));
        std::env::set_var(V.name, "twelve");
        assert_eq!(V.parse::<u16>(), None);
        assert!(!V.is_on());
        std::env::set_var(V.name, "1");
        assert!(V.is_on() && V.is("1"));
        std::env::set_var(V.name, "");
        assert_eq!(V.text(), None);
        std::env::remove_var(V.name);
    }

    #[test]
    fn help_lists_every_variable() {
        let h = help_text();
        for v in ALL {
            assert!(h.contains(v.name), "{}", v.name);
        }
    }
}
